-- The Crowbar model: deployment roles (per-deployment role defaults),
-- snapshots (a linear history per deployment: proposed, committed,
-- archived) and the noderole graph they hold.

CREATE TABLE deployment_roles (
    id            bigserial PRIMARY KEY,
    deployment_id bigint      NOT NULL REFERENCES deployments (id) ON DELETE CASCADE,
    role_id       bigint      NOT NULL REFERENCES roles (id) ON DELETE CASCADE,
    data          jsonb       NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (deployment_id, role_id)
);

CREATE TABLE snapshots (
    id            bigserial PRIMARY KEY,
    deployment_id bigint      NOT NULL REFERENCES deployments (id) ON DELETE CASCADE,
    state         text        NOT NULL DEFAULT 'proposed'
                  CHECK (state IN ('proposed', 'committed', 'archived')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    committed_at  timestamptz,
    archived_at   timestamptz
);
CREATE INDEX snapshots_deployment_idx ON snapshots (deployment_id, id);
-- At most one proposed and one committed snapshot per deployment.
CREATE UNIQUE INDEX snapshots_one_proposed ON snapshots (deployment_id) WHERE state = 'proposed';
CREATE UNIQUE INDEX snapshots_one_committed ON snapshots (deployment_id) WHERE state = 'committed';

CREATE TABLE noderoles (
    id          bigserial PRIMARY KEY,
    snapshot_id bigint      NOT NULL REFERENCES snapshots (id) ON DELETE CASCADE,
    node_id     bigint      NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    role_id     bigint      NOT NULL REFERENCES roles (id) ON DELETE CASCADE,
    state       text        NOT NULL DEFAULT 'proposed'
                CHECK (state IN ('proposed', 'todo', 'blocked', 'transition', 'active', 'error')),
    user_data   jsonb       NOT NULL DEFAULT '{}',
    system_data jsonb       NOT NULL DEFAULT '{}',
    wall        jsonb       NOT NULL DEFAULT '{}',
    run_count   integer     NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (snapshot_id, node_id, role_id)
);
CREATE INDEX noderoles_node_idx ON noderoles (node_id, state);
CREATE INDEX noderoles_role_idx ON noderoles (snapshot_id, role_id);
-- The annealer's queue.
CREATE INDEX noderoles_todo_idx ON noderoles (snapshot_id, id) WHERE state = 'todo';

CREATE TABLE noderole_edges (
    parent_id bigint NOT NULL REFERENCES noderoles (id) ON DELETE CASCADE,
    child_id  bigint NOT NULL REFERENCES noderoles (id) ON DELETE CASCADE,
    PRIMARY KEY (parent_id, child_id)
);
CREATE INDEX noderole_edges_child_idx ON noderole_edges (child_id);

-- Every deployment (the system one on a fresh install) starts with an
-- empty committed snapshot; deployments created later get one when first
-- needed (EnsureSnapshot).
INSERT INTO snapshots (deployment_id, state, committed_at)
SELECT id, 'committed', now() FROM deployments;
