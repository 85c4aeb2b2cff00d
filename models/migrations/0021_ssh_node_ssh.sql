-- The ssh jig (issue 13): how the worker reaches a node over SSH. One row
-- per node that has SSH settings. private_key is a secret: the API never
-- returns it (it answers "***"), and it is the column the secrets work
-- encrypts at rest. known_hosts pins the node's host key: lines in
-- OpenSSH's known_hosts format, pre-seeded through the API or recorded on
-- first use; a key that matches none of them fails the run.
CREATE TABLE node_ssh (
    node_id     bigint      PRIMARY KEY REFERENCES nodes (id) ON DELETE CASCADE,
    ssh_user    text        NOT NULL DEFAULT 'root',
    port        integer     NOT NULL DEFAULT 22 CHECK (port BETWEEN 1 AND 65535),
    -- the host to dial; empty: the node's address (without its agent port),
    -- else its name
    host        text        NOT NULL DEFAULT '',
    -- PEM private key (sensitive, see above)
    private_key text        NOT NULL DEFAULT '',
    known_hosts text        NOT NULL DEFAULT '',
    updated_at  timestamptz NOT NULL DEFAULT now()
);
