-- Plugins: named, versioned bundles of graphs that a deployment enables.
-- Graphs of one type merge release -> enabled plugins (in plugin id order)
-- -> deployment; plugin graphs live in graphs with owner_kind 'plugin'.

CREATE TABLE plugins (
    id          bigserial PRIMARY KEY,
    name        text        NOT NULL,
    version     text        NOT NULL,
    title       text        NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (name, version)
);

CREATE TABLE deployment_plugins (
    deployment_id bigint      NOT NULL REFERENCES deployments (id) ON DELETE CASCADE,
    plugin_id     bigint      NOT NULL REFERENCES plugins (id) ON DELETE CASCADE,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (deployment_id, plugin_id)
);
CREATE INDEX deployment_plugins_plugin_idx ON deployment_plugins (plugin_id);
