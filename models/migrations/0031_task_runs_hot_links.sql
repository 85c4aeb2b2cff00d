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
DROP INDEX task_runs_chain_idx;
ALTER TABLE task_runs SET (fillfactor = 80);
