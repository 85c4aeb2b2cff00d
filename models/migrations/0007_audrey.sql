-- Audrey (seed 003): deployables imported from templates/assemblies/deployable
-- documents, one instance per deployable assembly (each a node-to-be with its
-- instance config), and the config server's state: what each instance has
-- reported back for its provided parameters.

CREATE TABLE deployables (
    id            bigserial PRIMARY KEY,
    -- the deployable UUID of the instance-config documents
    uuid          uuid        NOT NULL UNIQUE,
    name          text        NOT NULL UNIQUE,
    -- the deployment the instances' nodes were created in
    deployment_id bigint      NOT NULL REFERENCES deployments (id),
    -- xml | yaml: how it was imported
    format        text        NOT NULL,
    -- the imported templates, assemblies and deployable (audrey.Document)
    document      jsonb       NOT NULL,
    -- service name -> {role, scripts, instances}: which instances carry
    -- which service, i.e. what a configuration engine applies where
    service_map   jsonb       NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE deployable_instances (
    id                 bigserial PRIMARY KEY,
    -- the instance UUID: /configs/:uuid, /params/:uuid, /reply/:uuid
    uuid               uuid        NOT NULL UNIQUE,
    deployable_id      bigint      NOT NULL REFERENCES deployables (id) ON DELETE CASCADE,
    -- order in the deployable (decides ties of match-type first, list order)
    position           integer     NOT NULL,
    name               text        NOT NULL,
    assembly_type      text        NOT NULL,
    hwp                text        NOT NULL DEFAULT '',
    node_id            bigint      REFERENCES nodes (id) ON DELETE SET NULL,
    -- the instance config (audrey.InstanceConfig), replaceable by POST /configs
    config             jsonb       NOT NULL,
    -- SHA-256 of the instance's own credential
    token_hash         text        NOT NULL UNIQUE,
    -- provided parameter -> {value, at}: what PUT /reply stored
    replies            jsonb       NOT NULL DEFAULT '{}',
    -- 200/202/204 of the last GET /configs, NULL before the first
    last_config_status integer,
    config_fetched_at  timestamptz,
    replied_at         timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    UNIQUE (deployable_id, name)
);
CREATE INDEX deployable_instances_deployable ON deployable_instances (deployable_id, position);
