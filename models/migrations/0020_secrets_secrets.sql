-- Named secrets of a deployment: the value is sealed with AES-256-GCM
-- (nonce || ciphertext) under the key named by key_id; nothing here is
-- readable without the server's secret key.
CREATE TABLE secrets (
    deployment_id bigint NOT NULL REFERENCES deployments (id) ON DELETE CASCADE,
    name          text   NOT NULL,
    key_id        text   NOT NULL,
    sealed        bytea  NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (deployment_id, name)
);
