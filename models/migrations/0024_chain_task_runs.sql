-- Chains (issue 14): a node's ready tasks with no cross-node wait between
-- them are handed to its agent under one activity, RunChainOnNode. Each
-- task keeps its own row, state, log and exit code; these two columns
-- link the rows of a chain so that the API, when the agent reports one,
-- dispatches the next itself instead of going back to the workflow.
-- chain_head is the chain's first run (the activity's), chain_next the
-- run dispatched after this one succeeds; both are NULL on a run
-- dispatched alone (RunTaskOnNode), and set again by every dispatch.
ALTER TABLE task_runs ADD COLUMN chain_head bigint, ADD COLUMN chain_next bigint;
-- The states of a chain's runs, read when its activity completes.
CREATE INDEX task_runs_chain_idx ON task_runs (chain_head) WHERE chain_head IS NOT NULL;
