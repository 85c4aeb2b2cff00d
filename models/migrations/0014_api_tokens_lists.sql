-- The operator's console: two more token scopes, and the indexes that keep
-- the paginated lists (keyset, newest first) answering from an index.
ALTER TABLE api_tokens DROP CONSTRAINT IF EXISTS api_tokens_scope_check;
ALTER TABLE api_tokens ADD CONSTRAINT api_tokens_scope_check
    CHECK (scope IN ('admin', 'operator', 'viewer', 'enroll'));

-- GET /transactions: newest first, keyset on (created_at, id), optionally
-- of one deployment (transactions_deployment_idx covers that filter's order
-- but not the id tie-break) or in one status.
CREATE INDEX transactions_created_idx ON transactions (created_at DESC, id DESC);
DROP INDEX IF EXISTS transactions_deployment_idx;
CREATE INDEX transactions_deployment_idx ON transactions (deployment_id, created_at DESC, id DESC);
CREATE INDEX transactions_status_idx ON transactions (status, created_at DESC, id DESC);

-- GET /transactions/:uuid/runs: plan order, keyset on (graph_index,
-- position, node_name, id), so a page of a 20,000-run transaction is an
-- index range scan.
CREATE INDEX task_runs_tx_order_idx ON task_runs (transaction_id, graph_index, position, node_name, id);
