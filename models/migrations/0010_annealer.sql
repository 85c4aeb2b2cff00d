-- The annealer runs noderoles through their jigs. A noderole run is a task
-- run that belongs to a noderole instead of a transaction, so the agents'
-- work queue, heartbeats and reports serve both.
ALTER TABLE task_runs ALTER COLUMN transaction_id DROP NOT NULL;
ALTER TABLE task_runs ADD COLUMN noderole_id bigint REFERENCES noderoles (id) ON DELETE CASCADE;
-- The attributes handed to the jig, and what it handed back (NULL: nothing
-- came back yet).
ALTER TABLE task_runs ADD COLUMN attrs_in jsonb;
ALTER TABLE task_runs ADD COLUMN attrs_out jsonb;
ALTER TABLE task_runs ADD CONSTRAINT task_runs_owner_check
    CHECK ((transaction_id IS NULL) <> (noderole_id IS NULL));
-- One run row per run of a noderole: position is the noderole's run number.
CREATE UNIQUE INDEX task_runs_noderole_idx ON task_runs (noderole_id, position)
    WHERE noderole_id IS NOT NULL;

-- Noderoles in transition, per node: the annealer gives a node one at a time.
CREATE INDEX noderoles_transition_idx ON noderoles (node_id) WHERE state = 'transition';
-- Runs in flight per node: a node busy with a transaction's task gets no
-- noderole until it finishes.
CREATE INDEX task_runs_running_idx ON task_runs (node_id) WHERE state = 'running';
