-- The ssh jig's node keys are sealed at rest with the secret keyring, as
-- deployment secrets are (models.Store.SetNodeSSH): key_id names the key
-- that sealed sealed_key, whose additional data binds it to the node.
-- private_key stays for the rows written before this migration: a server
-- with a keyring seals them when it starts (and `worker secrets rotate`
-- does too), clearing the plain column; new keys never go there. A SQL
-- migration cannot seal them itself: the keys live outside the database.
ALTER TABLE node_ssh
    ADD COLUMN key_id     text  NOT NULL DEFAULT '',
    ADD COLUMN sealed_key bytea;
