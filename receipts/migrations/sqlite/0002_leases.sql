-- cairn ledger, schema 2: leases, retries, cancellation, pauses.
--
-- A lease is (lease_id, lease_owner, lease_expires_at); lease_id is a random fencing token that
-- every heartbeat, completion, failure and release must present, and that only counts while
-- lease_expires_at is in the future at the time of the write. Heartbeats extend the lease up
-- to deadline_at (the hard limit of one run), never beyond.

ALTER TABLE jobs ADD COLUMN started_at INTEGER;
ALTER TABLE jobs ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0
    CHECK (cancel_requested IN (0, 1));
-- Why run_at holds its value: 'accepted', 'backoff after attempt 2: ...', 'retry-after ...'.
ALTER TABLE jobs ADD COLUMN run_at_rule TEXT NOT NULL DEFAULT 'accepted';

-- Claiming is paused for a dataset, or for all of them ('*').
-- A resume first stamps changed_by/change_cause/changed_at, then deletes the row, so that the
-- trigger can attribute the resume.
CREATE TABLE claim_pauses (
    dataset      TEXT    PRIMARY KEY,
    reason       TEXT    NOT NULL,
    actor        TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    changed_by   TEXT    NOT NULL,
    change_cause TEXT    NOT NULL,
    changed_at   INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

CREATE INDEX jobs_running_expiry ON jobs(lease_expires_at) WHERE state = 'running';

CREATE TRIGGER job_cancel_requested AFTER UPDATE OF cancel_requested ON jobs
WHEN NEW.cancel_requested = 1 AND OLD.cancel_requested = 0
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    SELECT CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_at ELSE now_micros END,
           'job', NEW.id, 'cancel_requested', NEW.state, NEW.state,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_by ELSE 'unattributed' END,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.change_cause ELSE 'unattributed_write' END
    FROM db_clock;
END;

CREATE TRIGGER pause_added AFTER INSERT ON claim_pauses
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.created_at, 'pause', NEW.dataset, 'paused', NULL, 'paused', NEW.actor, NEW.reason);
END;

CREATE TRIGGER pause_lifted AFTER DELETE ON claim_pauses
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (OLD.changed_at, 'pause', OLD.dataset, 'resumed', 'paused', NULL, OLD.changed_by,
            OLD.change_cause);
END;

-- Claims walk the datasets with due work through this index (a skip scan), and take each
-- dataset's first jobs from it: a claim costs O(datasets x batch), not O(pending jobs).
CREATE INDEX jobs_claim_by_dataset ON jobs(dataset, priority DESC, run_at)
    WHERE state IN ('pending', 'retry_wait');
