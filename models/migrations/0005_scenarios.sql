-- Scenarios (Fuel graph concept): a named, ordered list of acts, each a graph
-- type to run on a set of nodes given either explicitly or by an expression.
-- Executing a scenario runs its acts as the graphs of one transaction.

CREATE TABLE scenarios (
    id          bigserial PRIMARY KEY,
    name        text        NOT NULL UNIQUE,
    description text        NOT NULL DEFAULT '',
    -- shipped with anneal (scenarios/*.yaml), upserted at start; not deletable
    builtin     boolean     NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE scenario_acts (
    id                  bigserial PRIMARY KEY,
    scenario_id         bigint      NOT NULL REFERENCES scenarios (id) ON DELETE CASCADE,
    -- execution order, from 1
    position            integer     NOT NULL CHECK (position >= 1),
    graph_type          text        NOT NULL,
    -- {"ids": [1, 2]} (explicit node ids), {"expr": "<CEL>"} (evaluated over
    -- the deployment's nodes when the scenario runs) or {} (all nodes)
    nodes               jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(nodes) = 'object'),
    -- per-act safety valves; NULL means the transaction's default
    max_nodes_in_flight integer     CHECK (max_nodes_in_flight >= 1),
    failure_threshold   integer     CHECK (failure_threshold BETWEEN 0 AND 100),
    created_at          timestamptz NOT NULL DEFAULT now(),
    UNIQUE (scenario_id, position)
);
