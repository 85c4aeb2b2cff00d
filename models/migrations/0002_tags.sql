-- Tags (Fuel role decomposition): the tags a release or a deployment defines,
-- and the primary node of every has_primary tag per deployment. The tags a
-- node holds stay in nodes.tags.

CREATE TABLE tags (
    id          bigserial PRIMARY KEY,
    owner_kind  text        NOT NULL CHECK (owner_kind IN ('release', 'deployment')),
    owner_id    bigint      NOT NULL,
    name        text        NOT NULL,
    -- produced by a role of the release: only a new release changes it
    read_only   boolean     NOT NULL DEFAULT false,
    has_primary boolean     NOT NULL DEFAULT false,
    -- declared by the release (tags_metadata or a role's tags), as opposed to
    -- created by a user: a re-import replaces declared tags, keeps the others
    declared    boolean     NOT NULL DEFAULT false,
    metadata    jsonb       NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (owner_kind, owner_id, name)
);

CREATE TABLE primary_tags (
    deployment_id bigint NOT NULL REFERENCES deployments (id) ON DELETE CASCADE,
    tag           text   NOT NULL,
    node_id       bigint NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    PRIMARY KEY (deployment_id, tag)
);
CREATE INDEX primary_tags_node_idx ON primary_tags (node_id);

-- Releases imported before this migration get their declared tags: every
-- tag of tags_metadata and every tag a role produces (read only).
INSERT INTO tags (owner_kind, owner_id, name, read_only, has_primary, declared, metadata)
SELECT 'release', d.release_id, d.name, bool_or(d.from_role),
       COALESCE(bool_or((r.tags_metadata -> d.name ->> 'has_primary')::boolean), false),
       true,
       COALESCE((array_agg(r.tags_metadata -> d.name))[1] - 'has_primary', '{}'::jsonb)
FROM (
    SELECT ro.release_id, t.name, true AS from_role
    FROM roles ro, jsonb_array_elements_text(ro.tags) AS t(name)
    UNION ALL
    SELECT re.id, m.key, false
    FROM releases re, jsonb_each(re.tags_metadata) AS m(key, value)
) d
JOIN releases r ON r.id = d.release_id
WHERE d.name <> ''
GROUP BY d.release_id, d.name;
