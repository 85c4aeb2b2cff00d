-- The outputs a run sees (models.Store.RunContextWith): the succeeded or
-- skipped runs of its transaction that left outputs. Read for every run
-- handed to an agent; without this index it scanned every run of the
-- transaction (20,000 in a 1,000-node deployment of 20 tasks).
CREATE INDEX task_runs_tx_outputs_idx ON task_runs (transaction_id)
    WHERE state IN ('succeeded', 'skipped') AND outputs <> '{}'::jsonb;
