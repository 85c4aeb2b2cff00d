-- Planning a 1,000-node graph inserts 20,000 runs in one statement (COPY).
-- The insert trigger of 0016 handed their ids to anneal_notify_runs, which
-- read each of them back from task_runs (20,000 index lookups, a third of a
-- second on a busy machine) only to count them per transaction. The rows
-- are in the transition table already: a large insert is now counted
-- there. The events are the same: up to 200 rows one by one (as before,
-- through anneal_notify_runs), more as one "runs" event per transaction.
CREATE OR REPLACE FUNCTION anneal_events_runs_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
BEGIN
    SELECT array_agg(id) INTO ids FROM new_runs;
    IF ids IS NULL OR cardinality(ids) <= 200 THEN
        PERFORM anneal_notify_runs(ids);
        RETURN NULL;
    END IF;
    PERFORM pg_notify('anneal_events', json_build_object(
        'kind', 'runs', 'id', g.transaction_id, 'deployment_id', g.deployment_id,
        'state', 'changed', 'count', g.n)::text)
    FROM (SELECT r.transaction_id, coalesce(t.deployment_id, nd.deployment_id) AS deployment_id, count(*) AS n
          FROM new_runs r
          LEFT JOIN transactions t ON t.id = r.transaction_id
          LEFT JOIN nodes nd ON nd.id = r.node_id
          GROUP BY 1, 2) g;
    RETURN NULL;
END $$;
