-- The live event stream (GET /api/v1/events): every change of a
-- transaction's status, a run's state, a node's status, and a noderole's
-- state is announced on the NOTIFY channel anneal_events by a trigger, in the
-- same database transaction as the write, so an event is sent exactly when
-- its change commits, whichever code path wrote it. Payloads are small JSON
-- objects (kind, id, deployment_id, state and a few names; far below
-- NOTIFY's 8000 bytes). The API fans them out to its subscribers.

CREATE FUNCTION anneal_events_transaction() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r transactions;
BEGIN
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    PERFORM pg_notify('anneal_events', json_build_object(
        'kind', 'transaction', 'id', r.id, 'deployment_id', r.deployment_id,
        'state', CASE WHEN TG_OP = 'DELETE' THEN 'deleted' ELSE r.status END)::text);
    RETURN NULL;
END $$;

CREATE TRIGGER transactions_events AFTER INSERT OR DELETE ON transactions
    FOR EACH ROW EXECUTE FUNCTION anneal_events_transaction();
CREATE TRIGGER transactions_events_update AFTER UPDATE ON transactions
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION anneal_events_transaction();

-- Nodes: heartbeats (last_seen_at) say nothing new; what a person watches
-- does. A node moved to another deployment is announced to both.
CREATE FUNCTION anneal_events_node() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r nodes;
    from_dep bigint;
BEGIN
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    IF TG_OP = 'UPDATE' AND OLD.deployment_id <> NEW.deployment_id THEN
        from_dep := OLD.deployment_id;
    END IF;
    PERFORM pg_notify('anneal_events', json_build_object(
        'kind', 'node', 'id', r.id, 'deployment_id', r.deployment_id, 'from_deployment_id', from_dep,
        'state', CASE WHEN TG_OP = 'DELETE' THEN 'deleted' ELSE r.status END,
        'name', r.name, 'alive', r.alive, 'progress', r.progress)::text);
    RETURN NULL;
END $$;

CREATE TRIGGER nodes_events AFTER INSERT OR DELETE ON nodes
    FOR EACH ROW EXECUTE FUNCTION anneal_events_node();
CREATE TRIGGER nodes_events_update AFTER UPDATE ON nodes
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status
        OR OLD.alive IS DISTINCT FROM NEW.alive
        OR OLD.progress IS DISTINCT FROM NEW.progress
        OR OLD.error_type IS DISTINCT FROM NEW.error_type
        OR OLD.roles IS DISTINCT FROM NEW.roles
        OR OLD.deployment_id IS DISTINCT FROM NEW.deployment_id
        OR OLD.available IS DISTINCT FROM NEW.available)
    EXECUTE FUNCTION anneal_events_node();

-- Runs and noderoles are written many at a time (planning inserts a whole
-- transaction's runs, a stop cancels the rest): the triggers are per
-- statement, over its transition tables. Up to 200 changed rows are
-- announced one by one; a larger statement is announced as one "runs" (or
-- "noderoles") event per transaction (snapshot) with a count, for listeners
-- to read the rows again, so that a 20,000-run plan is not 20,000
-- notifications.
-- anneal_notify_runs announces the runs of ids (after the statement that
-- changed them, so it reads them from the table).
CREATE FUNCTION anneal_notify_runs(ids bigint[]) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF ids IS NULL OR cardinality(ids) = 0 THEN
        RETURN;
    ELSIF cardinality(ids) <= 200 THEN
        PERFORM pg_notify('anneal_events', json_build_object(
            'kind', 'run', 'id', r.id,
            'deployment_id', coalesce(t.deployment_id, nd.deployment_id),
            'state', r.state, 'transaction', r.transaction_id, 'noderole', r.noderole_id,
            'node', r.node_name, 'task', r.task_name, 'graph', r.graph_index, 'attempt', r.attempt)::text)
        FROM task_runs r
        LEFT JOIN transactions t ON t.id = r.transaction_id
        LEFT JOIN nodes nd ON nd.id = r.node_id
        WHERE r.id = ANY (ids)
        ORDER BY r.id;
    ELSE
        PERFORM pg_notify('anneal_events', json_build_object(
            'kind', 'runs', 'id', g.transaction_id, 'deployment_id', g.deployment_id,
            'state', 'changed', 'count', g.n)::text)
        FROM (SELECT r.transaction_id, coalesce(t.deployment_id, nd.deployment_id) AS deployment_id, count(*) AS n
              FROM task_runs r
              LEFT JOIN transactions t ON t.id = r.transaction_id
              LEFT JOIN nodes nd ON nd.id = r.node_id
              WHERE r.id IN (SELECT unnest(ids))
              GROUP BY 1, 2) g;
    END IF;
END $$;

CREATE FUNCTION anneal_events_runs_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM anneal_notify_runs((SELECT array_agg(id) FROM new_runs));
    RETURN NULL;
END $$;

CREATE FUNCTION anneal_events_runs_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM anneal_notify_runs((SELECT array_agg(n.id) FROM new_runs n JOIN old_runs o USING (id)
        WHERE n.state IS DISTINCT FROM o.state OR n.attempt IS DISTINCT FROM o.attempt));
    RETURN NULL;
END $$;

CREATE TRIGGER task_runs_events_insert AFTER INSERT ON task_runs
    REFERENCING NEW TABLE AS new_runs
    FOR EACH STATEMENT EXECUTE FUNCTION anneal_events_runs_insert();
CREATE TRIGGER task_runs_events_update AFTER UPDATE ON task_runs
    REFERENCING OLD TABLE AS old_runs NEW TABLE AS new_runs
    FOR EACH STATEMENT EXECUTE FUNCTION anneal_events_runs_update();

-- anneal_notify_noderoles announces the noderoles of ids, as
-- anneal_notify_runs does runs (a large statement: one event per snapshot).
CREATE FUNCTION anneal_notify_noderoles(ids bigint[]) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF ids IS NULL OR cardinality(ids) = 0 THEN
        RETURN;
    ELSIF cardinality(ids) <= 200 THEN
        PERFORM pg_notify('anneal_events', json_build_object(
            'kind', 'noderole', 'id', r.id, 'deployment_id', s.deployment_id, 'state', r.state,
            'snapshot', r.snapshot_id, 'node', r.node_id, 'role', r.role_id)::text)
        FROM noderoles r
        JOIN snapshots s ON s.id = r.snapshot_id
        WHERE r.id = ANY (ids)
        ORDER BY r.id;
    ELSE
        PERFORM pg_notify('anneal_events', json_build_object(
            'kind', 'noderoles', 'id', g.snapshot_id, 'deployment_id', g.deployment_id,
            'state', 'changed', 'count', g.n)::text)
        FROM (SELECT r.snapshot_id, s.deployment_id, count(*) AS n
              FROM noderoles r
              JOIN snapshots s ON s.id = r.snapshot_id
              WHERE r.id IN (SELECT unnest(ids))
              GROUP BY 1, 2) g;
    END IF;
END $$;

CREATE FUNCTION anneal_events_noderoles_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM anneal_notify_noderoles((SELECT array_agg(id) FROM new_noderoles));
    RETURN NULL;
END $$;

CREATE FUNCTION anneal_events_noderoles_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM anneal_notify_noderoles((SELECT array_agg(n.id) FROM new_noderoles n JOIN old_noderoles o USING (id)
        WHERE n.state IS DISTINCT FROM o.state));
    RETURN NULL;
END $$;

CREATE TRIGGER noderoles_events_insert AFTER INSERT ON noderoles
    REFERENCING NEW TABLE AS new_noderoles
    FOR EACH STATEMENT EXECUTE FUNCTION anneal_events_noderoles_insert();
CREATE TRIGGER noderoles_events_update AFTER UPDATE ON noderoles
    REFERENCING OLD TABLE AS old_noderoles NEW TABLE AS new_noderoles
    FOR EACH STATEMENT EXECUTE FUNCTION anneal_events_noderoles_update();
