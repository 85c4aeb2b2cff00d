-- Exactly once on the node, at least once on the wire: a run handed to an
-- agent counts as delivered only once the agent acknowledges it (acked_at,
-- set by its ack call, first run heartbeat or result). Until then
-- lease_until says when the run is offered again, so a claim whose answer
-- never reached the agent (the server killed in between, a lost connection)
-- is not lost. Runs the worker executes itself have claimed_at set and no
-- lease, so they are never offered to an agent.
ALTER TABLE task_runs
    ADD COLUMN acked_at    timestamptz,
    ADD COLUMN lease_until timestamptz;

-- The agents' work queue: runs dispatched to a node and not yet handed out,
-- or handed out and not acknowledged.
DROP INDEX IF EXISTS task_runs_work_idx;
CREATE INDEX task_runs_work_idx ON task_runs (node_id)
    WHERE state = 'running' AND acked_at IS NULL AND (claimed_at IS NULL OR lease_until IS NOT NULL);
