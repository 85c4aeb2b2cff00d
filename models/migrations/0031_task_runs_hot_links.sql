-- A chain's links (chain_head, chain_next) are written on every run of
-- the chain when it is dispatched, one more version of each row. With
-- task_runs_chain_idx on chain_head, that update was never HOT: it added an
-- entry to each of the table's indexes for every run (about 420 bytes of
-- WAL per run), and every later update of a chained run, its dispatch and
-- its result, one more to the chain index. The chain's runs are found
-- instead by their head's transaction, graph and node (the runs' unique
-- index; models.chainRunIDsSQL), and pages keep a fifth free, so that the
-- link update, which changes no indexed column, stays on the row's page
-- as a HOT update (about 90 bytes of WAL per run), and the dispatch and
-- result updates after it can often stay there too. The fill factor
-- applies to the pages written from now on.
--
-- DROP INDEX locks task_runs whole until the migrations commit: it waits
-- at most 5 s for the lock (then the server's start fails, to be tried
-- again) rather than queue every query of the table behind it. During a
-- rolling restart, a server still running older code looks a chain's runs
-- up by chain_head without the index, a scan of task_runs per chain that
-- ends, correct but slow on a large table: restart every worker and API
-- process promptly after the first.
SET LOCAL lock_timeout = '5s';
DROP INDEX task_runs_chain_idx;
ALTER TABLE task_runs SET (fillfactor = 80);
SET LOCAL lock_timeout TO DEFAULT;
