-- Full task logs: the agent ships each run's whole log while it runs, in
-- chunks addressed by their byte offset in the log (so a chunk sent again
-- after a lost answer or a restart is not stored twice). run_logs holds one
-- row per run and attempt: size is how many bytes of the log the server has
-- seen (the offset the next chunk must start at), stored how many it kept.
-- Beyond the cap (models.MaxRunLogBytes) the head is kept, truncated is set
-- and the rest is counted but dropped.
CREATE TABLE run_logs (
    run_id     bigint      NOT NULL REFERENCES task_runs (id) ON DELETE CASCADE,
    attempt    integer     NOT NULL,
    size       bigint      NOT NULL DEFAULT 0,
    stored     bigint      NOT NULL DEFAULT 0,
    truncated  boolean     NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, attempt)
);

-- The kept bytes, one row per chunk received; pos is the chunk's offset in
-- the log, so reading is one range scan in order.
CREATE TABLE run_log_chunks (
    run_id  bigint  NOT NULL,
    attempt integer NOT NULL,
    pos     bigint  NOT NULL,
    data    bytea   NOT NULL,
    PRIMARY KEY (run_id, attempt, pos),
    FOREIGN KEY (run_id, attempt) REFERENCES run_logs (run_id, attempt) ON DELETE CASCADE
);
