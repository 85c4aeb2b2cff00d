-- A transaction's plan shows why each task that does not run is left out:
-- runs skipped (LCM, task type) say so in their own row; tasks the
-- execute's node and task filters left out have no row, so planning records
-- them here, per graph index: {"0": [{"node_id", "node", "task", "reason"}]}.
ALTER TABLE transactions
    ADD COLUMN filtered_out jsonb NOT NULL DEFAULT '{}'::jsonb;
