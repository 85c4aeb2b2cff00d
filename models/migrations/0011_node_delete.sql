-- Deleting a node (DELETE /api/v1/nodes/:id) and the network roles'
-- address allocations.
--
-- What references nodes (id), and what a node's deletion does to it:
--   noderoles, primary_tags, software_deployments  ON DELETE CASCADE: they
--     describe the node and mean nothing without it (a noderole's runs go
--     with the noderole);
--   deployable_instances  ON DELETE SET NULL: the instance is a node-to-be
--     again;
--   task_runs  no action so far, so a node that had ever run a task could
--     not be deleted. A transaction's runs are its history and must stay
--     readable (counts, progress, failed runs, outputs later graphs read),
--     and each run already carries node_name: the run keeps its row and
--     loses only the link to the node (node_id NULL).
ALTER TABLE task_runs ALTER COLUMN node_id DROP NOT NULL;
ALTER TABLE task_runs DROP CONSTRAINT task_runs_node_id_fkey;
ALTER TABLE task_runs ADD CONSTRAINT task_runs_node_id_fkey
    FOREIGN KEY (node_id) REFERENCES nodes (id) ON DELETE SET NULL;

-- Addresses allocated by the network roles (models/roles/network): a node
-- has at most one address per network, and an address belongs to at most
-- one node of its network. Host addresses only (no prefix): equality of
-- inet values includes the mask.
CREATE TABLE network_allocations (
    network    text        NOT NULL,
    address    inet        NOT NULL
               CHECK (masklen(address) = CASE family(address) WHEN 4 THEN 32 ELSE 128 END),
    node_id    bigint      NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (network, address),
    UNIQUE (network, node_id)
);
CREATE INDEX network_allocations_node_idx ON network_allocations (node_id);
