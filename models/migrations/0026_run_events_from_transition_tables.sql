-- Every change of a run's state is announced by the statement trigger of
-- 0016, which handed the changed ids to anneal_notify_runs, and that read
-- each row back from task_runs with its transaction and node. A run's
-- dispatch and its report are one-row updates, two per run: the detour
-- through the id array and the re-read cost a quarter of a millisecond of
-- Postgres time each, four times the update itself. The changed rows are in
-- the transition tables already: the events are now built there. They are
-- the same events: up to 200 changed rows one by one, in id order, more as
-- one "runs" event per transaction with a count; an update that changes no
-- state or attempt (an acknowledgement, a claim, a chain's link) sends none.
CREATE OR REPLACE FUNCTION anneal_events_runs_update() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    SELECT count(*) INTO n FROM new_runs r JOIN old_runs o USING (id)
    WHERE r.state IS DISTINCT FROM o.state OR r.attempt IS DISTINCT FROM o.attempt;
    IF n = 0 THEN
        RETURN NULL;
    ELSIF n <= 200 THEN
        PERFORM pg_notify('anneal_events', json_build_object(
            'kind', 'run', 'id', r.id,
            'deployment_id', coalesce(t.deployment_id, nd.deployment_id),
            'state', r.state, 'transaction', r.transaction_id, 'noderole', r.noderole_id,
            'node', r.node_name, 'task', r.task_name, 'graph', r.graph_index, 'attempt', r.attempt)::text)
        FROM new_runs r
        JOIN old_runs o USING (id)
        LEFT JOIN transactions t ON t.id = r.transaction_id
        LEFT JOIN nodes nd ON nd.id = r.node_id
        WHERE r.state IS DISTINCT FROM o.state OR r.attempt IS DISTINCT FROM o.attempt
        ORDER BY r.id;
    ELSE
        PERFORM pg_notify('anneal_events', json_build_object(
            'kind', 'runs', 'id', g.transaction_id, 'deployment_id', g.deployment_id,
            'state', 'changed', 'count', g.n)::text)
        FROM (SELECT r.transaction_id, coalesce(t.deployment_id, nd.deployment_id) AS deployment_id, count(*) AS n
              FROM new_runs r
              JOIN old_runs o USING (id)
              LEFT JOIN transactions t ON t.id = r.transaction_id
              LEFT JOIN nodes nd ON nd.id = r.node_id
              WHERE r.state IS DISTINCT FROM o.state OR r.attempt IS DISTINCT FROM o.attempt
              GROUP BY 1, 2) g;
    END IF;
    RETURN NULL;
END $$;
