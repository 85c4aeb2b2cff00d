-- A credential that stops working (an operator token revoked, a node's
-- agent credential replaced or deleted with its node) is announced on
-- anneal_credentials with its hash, so that every API server drops it
-- from its cache of verified tokens at once, not only the server that
-- made the change: the servers trust an agent's credential for a minute
-- without asking Postgres again, what most of an idle site's requests cost.
CREATE FUNCTION anneal_credential_revoked() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('anneal_credentials', OLD.agent_token_hash);
  RETURN NULL;
END $$;

CREATE FUNCTION anneal_token_revoked() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('anneal_credentials', OLD.token_hash);
  RETURN NULL;
END $$;

CREATE TRIGGER nodes_credential_deleted AFTER DELETE ON nodes
FOR EACH ROW WHEN (OLD.agent_token_hash IS NOT NULL)
EXECUTE FUNCTION anneal_credential_revoked();

CREATE TRIGGER nodes_credential_replaced AFTER UPDATE OF agent_token_hash ON nodes
FOR EACH ROW WHEN (OLD.agent_token_hash IS NOT NULL AND OLD.agent_token_hash IS DISTINCT FROM NEW.agent_token_hash)
EXECUTE FUNCTION anneal_credential_revoked();

CREATE TRIGGER api_tokens_revoked AFTER DELETE ON api_tokens
FOR EACH ROW EXECUTE FUNCTION anneal_token_revoked();
