-- The event triggers of 0016 (and 0025, 0026) announce every change of a
-- transaction, node, run and noderole with pg_notify, whether or not any
-- server has a client of the live event stream. At 100 nodes they were a
-- fifth of Postgres's CPU per task run (building each event's JSON, with
-- its joins, twice per run, and the notify queue, whose lock every
-- announcing commit takes in turn), and the API parsed every event it got
-- only to hand it to no one.
--
-- A server with clients of its event stream now holds a lease here (a row
-- per server, renewed while it has clients, left to lapse when it has
-- none); the triggers fire only while some lease is live. A server that
-- takes a lease when none was live knows the changes before it were not
-- announced, and tells its clients to read the state again (web/events.go).
CREATE TABLE event_listeners (
    id    text PRIMARY KEY,
    until timestamptz NOT NULL
);

-- anneal_events_wanted says whether some server listens to the events now.
-- PL/pgSQL rather than SQL: its plan is cached per session, where a SQL
-- function in a trigger's WHEN is planned again at every call.
CREATE FUNCTION anneal_events_wanted() RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM event_listeners WHERE until > now());
END $$;

-- The same triggers, with the same functions, each behind the lease.
DROP TRIGGER transactions_events ON transactions;
CREATE TRIGGER transactions_events AFTER INSERT OR DELETE ON transactions
    FOR EACH ROW WHEN (anneal_events_wanted())
    EXECUTE FUNCTION anneal_events_transaction();
DROP TRIGGER transactions_events_update ON transactions;
CREATE TRIGGER transactions_events_update AFTER UPDATE ON transactions
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status AND anneal_events_wanted())
    EXECUTE FUNCTION anneal_events_transaction();

DROP TRIGGER nodes_events ON nodes;
CREATE TRIGGER nodes_events AFTER INSERT OR DELETE ON nodes
    FOR EACH ROW WHEN (anneal_events_wanted())
    EXECUTE FUNCTION anneal_events_node();
DROP TRIGGER nodes_events_update ON nodes;
CREATE TRIGGER nodes_events_update AFTER UPDATE ON nodes
    FOR EACH ROW WHEN ((OLD.status IS DISTINCT FROM NEW.status
        OR OLD.alive IS DISTINCT FROM NEW.alive
        OR OLD.progress IS DISTINCT FROM NEW.progress
        OR OLD.error_type IS DISTINCT FROM NEW.error_type
        OR OLD.roles IS DISTINCT FROM NEW.roles
        OR OLD.deployment_id IS DISTINCT FROM NEW.deployment_id
        OR OLD.available IS DISTINCT FROM NEW.available) AND anneal_events_wanted())
    EXECUTE FUNCTION anneal_events_node();

DROP TRIGGER task_runs_events_insert ON task_runs;
CREATE TRIGGER task_runs_events_insert AFTER INSERT ON task_runs
    REFERENCING NEW TABLE AS new_runs
    FOR EACH STATEMENT WHEN (anneal_events_wanted())
    EXECUTE FUNCTION anneal_events_runs_insert();
DROP TRIGGER task_runs_events_update ON task_runs;
CREATE TRIGGER task_runs_events_update AFTER UPDATE ON task_runs
    REFERENCING OLD TABLE AS old_runs NEW TABLE AS new_runs
    FOR EACH STATEMENT WHEN (anneal_events_wanted())
    EXECUTE FUNCTION anneal_events_runs_update();

DROP TRIGGER noderoles_events_insert ON noderoles;
CREATE TRIGGER noderoles_events_insert AFTER INSERT ON noderoles
    REFERENCING NEW TABLE AS new_noderoles
    FOR EACH STATEMENT WHEN (anneal_events_wanted())
    EXECUTE FUNCTION anneal_events_noderoles_insert();
DROP TRIGGER noderoles_events_update ON noderoles;
CREATE TRIGGER noderoles_events_update AFTER UPDATE ON noderoles
    REFERENCING OLD TABLE AS old_noderoles NEW TABLE AS new_noderoles
    FOR EACH STATEMENT WHEN (anneal_events_wanted())
    EXECUTE FUNCTION anneal_events_noderoles_update();
