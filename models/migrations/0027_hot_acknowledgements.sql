-- Every run's acknowledgement (acked_at, lease_until) and claim (claimed_at,
-- lease_until) changed a column of task_runs_work_idx's predicate, so none
-- of them could be a HOT update: each wrote a new entry in every one of the
-- table's eleven indexes, 0.25 ms of Postgres time per acknowledgement at
-- 1,000 nodes. The agents' work queries (claim, next offer) find a node's
-- runs as well through task_runs_node_unfinished_idx (a node has a few
-- unfinished runs at a time); without this index the acknowledgement and
-- the claim change no indexed column. A HOT update also needs room on the
-- row's page: runs are updated four times in their life, so their pages
-- (about nine runs each) keep 15 % free from now on.
DROP INDEX IF EXISTS task_runs_work_idx;
ALTER TABLE task_runs SET (fillfactor = 85);
