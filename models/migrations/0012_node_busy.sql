-- A node runs one thing at a time: a transaction's task or a noderole.
-- Dispatching a run and starting a noderole look for the node's unfinished
-- runs; this index keeps that lookup small.
DROP INDEX IF EXISTS task_runs_running_idx;
CREATE INDEX task_runs_node_unfinished_idx ON task_runs (node_id) WHERE state IN ('pending', 'running');
