-- LCM that is right: a run is skipped only when the last finished run of
-- its task on its node succeeded with the same inputs, and the inputs are
-- everything the task sees.
--
-- inputs_base digests the part of a run's inputs known when it is planned
-- (its task's definition, its node, the merged data it is sent in
-- attrs_in); inputs_hash adds the outputs of the runs it depends on and is
-- final once the run is dispatched. lcm says whether the run may be skipped
-- at all (not forced, not the verification graph, not a reboot).
ALTER TABLE task_runs
    ADD COLUMN inputs_base text    NOT NULL DEFAULT '',
    ADD COLUMN lcm         boolean NOT NULL DEFAULT false;

-- A deployment's attributes: part of the merged data its graph tasks see.
ALTER TABLE deployments ADD COLUMN attributes jsonb NOT NULL DEFAULT '{}';

-- The last finished run of a task on a node, whatever its outcome.
DROP INDEX IF EXISTS task_runs_lcm_idx;
CREATE INDEX task_runs_lcm_idx ON task_runs (node_id, graph_type, task_name, finished_at DESC)
    WHERE finished_at IS NOT NULL AND transaction_id IS NOT NULL;

-- The last erase_node or move_to_bootstrap of a node: its history before
-- that is forgotten.
CREATE INDEX task_runs_forget_idx ON task_runs (node_id, finished_at DESC)
    WHERE task_type IN ('erase_node', 'move_to_bootstrap') AND finished_at IS NOT NULL;
