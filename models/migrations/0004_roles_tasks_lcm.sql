-- A role with no task of its own runs its script as one task named after it.
ALTER TABLE roles ADD COLUMN script text NOT NULL DEFAULT '';

-- Planning warnings (e.g. a cross-node dependency that matched no node).
ALTER TABLE transactions ADD COLUMN warnings jsonb NOT NULL DEFAULT '[]';

-- Looking up a task's last successful run on a node, to skip it when its
-- inputs did not change.
CREATE INDEX task_runs_lcm_idx ON task_runs (node_id, graph_type, task_name, finished_at DESC)
    WHERE state = 'succeeded';
