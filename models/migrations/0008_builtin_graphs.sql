-- Built-in graphs (provision, verification, deletion) ship with anneal and
-- sit below every release: release, plugin and deployment graphs of the same
-- type override their tasks.
ALTER TABLE graphs DROP CONSTRAINT graphs_owner_kind_check;
ALTER TABLE graphs ADD CONSTRAINT graphs_owner_kind_check
    CHECK (owner_kind IN ('builtin', 'release', 'deployment', 'plugin'));
