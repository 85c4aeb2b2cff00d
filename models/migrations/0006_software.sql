-- Heat software config: immutable software configs (a script or document
-- with inputs and outputs schemas, run on a node by the hook its group
-- names) and software deployments binding a config to a node with input
-- values. Each deployment's rounds (DEPLOY, REDEPLOY, UNDEPLOY) run as a
-- Temporal workflow swd-<id> that waits for the node's agent to signal.

CREATE TABLE software_configs (
    id            bigserial PRIMARY KEY,
    name          text        NOT NULL,
    -- which hook on the node runs it: the built-in "script" or an
    -- executable of that name in the agent's hooks directory
    "group"       text        NOT NULL DEFAULT 'script',
    config        text        NOT NULL DEFAULT '',
    -- [{name, type, description, default}]
    inputs        jsonb       NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(inputs) = 'array'),
    -- [{name, type, description, error_output}]
    outputs       jsonb       NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(outputs) = 'array'),
    options       jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(options) = 'object'),
    -- the deployment (cluster) the config belongs to; NULL: any
    deployment_id bigint      REFERENCES deployments (id) ON DELETE CASCADE,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- Every change of a software deployment takes the next value: a node's
-- version (what its agent's long poll compares) is the maximum over its
-- deployments.
CREATE SEQUENCE software_deployment_version_seq;

CREATE TABLE software_deployments (
    id              bigserial PRIMARY KEY,
    -- a config in use cannot be deleted (409)
    config_id       bigint      NOT NULL REFERENCES software_configs (id) ON DELETE RESTRICT,
    node_id         bigint      NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    -- the deployment (cluster) on whose behalf it was made
    deployment_id   bigint      REFERENCES deployments (id) ON DELETE SET NULL,
    -- as given: values, or {"get_attr": [<deployment id>, "<output>"]}
    input_values    jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(input_values) = 'object'),
    -- with references resolved and defaults filled, when the round started
    resolved_inputs jsonb       NOT NULL DEFAULT '{}',
    action          text        NOT NULL DEFAULT 'DEPLOY' CHECK (action IN ('DEPLOY', 'REDEPLOY', 'UNDEPLOY')),
    status          text        NOT NULL DEFAULT 'WAITING'
                    CHECK (status IN ('WAITING', 'IN_PROGRESS', 'COMPLETE', 'FAILED')),
    status_reason   text        NOT NULL DEFAULT '',
    output_values   jsonb       NOT NULL DEFAULT '{}',
    timeout_sec     integer     NOT NULL DEFAULT 600 CHECK (timeout_sec >= 1),
    -- each action starts a new round (and a new run of workflow swd-<id>)
    round           integer     NOT NULL DEFAULT 1,
    -- the last round the agent signalled, and what it sent
    signaled_round  integer     NOT NULL DEFAULT 0,
    signal          jsonb       NOT NULL DEFAULT '{}',
    workflow_id     text        NOT NULL DEFAULT '',
    version         bigint      NOT NULL DEFAULT nextval('software_deployment_version_seq'),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX software_deployments_node ON software_deployments (node_id, id);
CREATE INDEX software_deployments_config ON software_deployments (config_id);
