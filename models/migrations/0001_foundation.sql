-- Foundation schema: tokens, releases and roles, deployments, nodes, graphs,
-- transactions and their task runs.

CREATE TABLE api_tokens (
    id           bigserial PRIMARY KEY,
    name         text        NOT NULL,
    scope        text        NOT NULL CHECK (scope IN ('admin', 'enroll')),
    token_hash   text        NOT NULL UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz
);

CREATE TABLE releases (
    id            bigserial PRIMARY KEY,
    name          text        NOT NULL,
    version       text        NOT NULL DEFAULT '',
    tags_metadata jsonb       NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (name, version)
);

CREATE TABLE roles (
    id          bigserial PRIMARY KEY,
    release_id  bigint      NOT NULL REFERENCES releases (id) ON DELETE CASCADE,
    name        text        NOT NULL,
    title       text        NOT NULL DEFAULT '',
    jig         text        NOT NULL DEFAULT 'agent',
    requires    jsonb       NOT NULL DEFAULT '[]',
    tags        jsonb       NOT NULL DEFAULT '[]',
    flags       jsonb       NOT NULL DEFAULT '[]',
    template    jsonb       NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (release_id, name)
);

CREATE TABLE deployments (
    id          bigserial PRIMARY KEY,
    name        text        NOT NULL UNIQUE,
    parent_id   bigint      REFERENCES deployments (id),
    release_id  bigint      REFERENCES releases (id),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- The system deployment receives every discovered node.
INSERT INTO deployments (name) VALUES ('system');

CREATE TABLE nodes (
    id               bigserial PRIMARY KEY,
    name             text        NOT NULL UNIQUE,
    admin            boolean     NOT NULL DEFAULT false,
    allocated        boolean     NOT NULL DEFAULT true,
    alive            boolean     NOT NULL DEFAULT false,
    available        boolean     NOT NULL DEFAULT true,
    status           text        NOT NULL DEFAULT 'discover'
                     CHECK (status IN ('discover', 'provisioned', 'deployed')),
    progress         integer     NOT NULL DEFAULT 100,
    error_type       text,
    roles            jsonb       NOT NULL DEFAULT '[]',
    tags             jsonb       NOT NULL DEFAULT '[]',
    attributes       jsonb       NOT NULL DEFAULT '{}',
    deployment_id    bigint      NOT NULL REFERENCES deployments (id),
    agent_token_hash text        UNIQUE,
    boot_id          text        NOT NULL DEFAULT '',
    address          text        NOT NULL DEFAULT '',
    last_seen_at     timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX nodes_deployment_idx ON nodes (deployment_id);

CREATE TABLE graphs (
    id          bigserial PRIMARY KEY,
    owner_kind  text        NOT NULL CHECK (owner_kind IN ('release', 'deployment', 'plugin')),
    owner_id    bigint      NOT NULL,
    type        text        NOT NULL,
    name        text        NOT NULL DEFAULT '',
    metadata    jsonb       NOT NULL DEFAULT '{}',
    tasks       jsonb       NOT NULL DEFAULT '[]',
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (owner_kind, owner_id, type)
);

CREATE TABLE transactions (
    id             uuid PRIMARY KEY,
    deployment_id  bigint      NOT NULL REFERENCES deployments (id),
    graphs         jsonb       NOT NULL,
    dry_run        boolean     NOT NULL DEFAULT false,
    force          boolean     NOT NULL DEFAULT false,
    status         text        NOT NULL DEFAULT 'pending'
                   CHECK (status IN ('pending', 'running', 'ready', 'error', 'stopped')),
    error          text        NOT NULL DEFAULT '',
    workflow_id    text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    started_at     timestamptz,
    finished_at    timestamptz
);
CREATE INDEX transactions_deployment_idx ON transactions (deployment_id, created_at DESC);

CREATE TABLE task_runs (
    id             bigserial PRIMARY KEY,
    transaction_id uuid        NOT NULL REFERENCES transactions (id) ON DELETE CASCADE,
    graph_index    integer     NOT NULL,
    graph_type     text        NOT NULL,
    node_id        bigint      NOT NULL REFERENCES nodes (id),
    node_name      text        NOT NULL,
    task_name      text        NOT NULL,
    task_type      text        NOT NULL DEFAULT 'shell',
    position       integer     NOT NULL,
    spec           jsonb       NOT NULL DEFAULT '{}',
    state          text        NOT NULL DEFAULT 'pending'
                   CHECK (state IN ('planned', 'pending', 'running', 'succeeded', 'failed',
                                    'blocked', 'skipped', 'cancelled')),
    attempt        integer     NOT NULL DEFAULT 0,
    task_token     bytea,
    claimed_at     timestamptz,
    started_at     timestamptz,
    finished_at    timestamptz,
    exit_code      integer,
    stdout_tail    text        NOT NULL DEFAULT '',
    stderr_tail    text        NOT NULL DEFAULT '',
    outputs        jsonb       NOT NULL DEFAULT '{}',
    error          text        NOT NULL DEFAULT '',
    inputs_hash    text        NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (transaction_id, graph_index, node_id, task_name)
);
CREATE INDEX task_runs_tx_state_idx ON task_runs (transaction_id, state);
-- The agents' work queue: runs dispatched to a node and not yet handed out.
CREATE INDEX task_runs_work_idx ON task_runs (node_id) WHERE state = 'running' AND claimed_at IS NULL;

CREATE TABLE run_edges (
    parent_id bigint NOT NULL REFERENCES task_runs (id) ON DELETE CASCADE,
    child_id  bigint NOT NULL REFERENCES task_runs (id) ON DELETE CASCADE,
    PRIMARY KEY (parent_id, child_id)
);
CREATE INDEX run_edges_child_idx ON run_edges (child_id);
