-- cairn ledger, schema 22: the events outbox.
--
-- Every change a client may want to hear about is written here by the store itself, in the
-- transaction that makes the change (as history is), whoever issued the statement: an event
-- can be neither lost (the change committed, so did its event) nor invented (the change rolled
-- back, so did its event). `seq` is the feed's cursor: on SQLite one writer commits at a time,
-- so sequence order is commit order. Events name identities (dataset, source key, revision,
-- job) and never content. `events_pruned` keeps the highest sequence retention removed, so a
-- cursor below it is known to have missed events.
CREATE TABLE events (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    type        TEXT    NOT NULL CHECK (type IN ('receipt.verified', 'receipt.failed',
                    'job.dead', 'source.superseded', 'source.tombstoned', 'source.erased',
                    'access.changed', 'connector.run.finished', 'verify.drift',
                    'verify.pass.finished', 'generation.switched')),
    at          INTEGER NOT NULL,
    dataset     TEXT,
    source_key  TEXT,
    revision_id TEXT,
    data        TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(data))
);
CREATE INDEX events_by_dataset ON events(dataset, seq);
CREATE INDEX events_by_time ON events(at);

CREATE TABLE events_pruned (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    through INTEGER NOT NULL
) STRICT;
INSERT INTO events_pruned (id, through) VALUES (1, 0);

-- A receipt verified in one store; and, once every receipt of its job is verified (or
-- excluded), the revision verified everywhere (`backend` "all").
CREATE TRIGGER event_receipt_verified AFTER UPDATE OF state ON projection_receipts
WHEN NEW.state = 'verified' AND OLD.state IS NOT 'verified'
BEGIN
    INSERT INTO events (type, at, dataset, source_key, revision_id, data)
    SELECT 'receipt.verified', NEW.changed_at, j.dataset, j.source_key, j.revision_id,
           json_object('job_id', j.id, 'backend', NEW.backend, 'generation', NEW.generation)
    FROM jobs j WHERE j.id = NEW.job_id;
    INSERT INTO events (type, at, dataset, source_key, revision_id, data)
    SELECT 'receipt.verified', NEW.changed_at, j.dataset, j.source_key, j.revision_id,
           json_object('job_id', j.id, 'backend', 'all', 'generation', NEW.generation,
                       'backends', (SELECT json_group_array(r.backend) FROM projection_receipts r
                                    WHERE r.job_id = j.id AND r.state = 'verified'))
    FROM jobs j WHERE j.id = NEW.job_id
      AND NOT EXISTS (SELECT 1 FROM projection_receipts r
                      WHERE r.job_id = j.id AND r.state NOT IN ('verified', 'excluded'));
END;

CREATE TRIGGER event_receipt_failed AFTER UPDATE OF state ON projection_receipts
WHEN NEW.state = 'failed' AND OLD.state IS NOT 'failed'
BEGIN
    INSERT INTO events (type, at, dataset, source_key, revision_id, data)
    SELECT 'receipt.failed', NEW.changed_at, j.dataset, j.source_key, j.revision_id,
           json_object('job_id', j.id, 'backend', NEW.backend, 'generation', NEW.generation)
    FROM jobs j WHERE j.id = NEW.job_id;
END;

-- A job that will not run again; a connector's run that ended either way.
CREATE TRIGGER event_job_ended AFTER UPDATE OF state ON jobs
WHEN NEW.state IS NOT OLD.state
 AND (NEW.state = 'dead' OR (NEW.kind = 'sync' AND NEW.state = 'completed'))
BEGIN
    INSERT INTO events (type, at, dataset, source_key, revision_id, data)
    SELECT 'job.dead', NEW.changed_at, NEW.dataset, NULLIF(NEW.source_key, ''),
           NEW.revision_id,
           json_object('job_id', NEW.id, 'kind', NEW.kind, 'attempt', NEW.attempt,
                       'error_code', NEW.last_error_code)
    WHERE NEW.state = 'dead';
    INSERT INTO events (type, at, dataset, source_key, revision_id, data)
    SELECT 'connector.run.finished', NEW.changed_at, NEW.dataset, NULL, NULL,
           json_object('job_id', NEW.id, 'connector_id', NEW.connector_id,
                       'outcome', NEW.state,
                       'report', (SELECT json(s.report) FROM sync_reports s
                                  WHERE s.job_id = NEW.id))
    WHERE NEW.kind = 'sync';
END;

-- A head moved: the revision it left is superseded; a head on a tombstone deletes the source.
CREATE TRIGGER event_source_head_moved AFTER UPDATE OF head_revision_id ON sources
WHEN NEW.head_revision_id IS NOT OLD.head_revision_id
BEGIN
    INSERT INTO events (type, at, dataset, source_key, revision_id, data)
    VALUES ('source.superseded', NEW.changed_at, NEW.dataset, NEW.source_key,
            OLD.head_revision_id, json_object('superseded_by', NEW.head_revision_id));
    INSERT INTO events (type, at, dataset, source_key, revision_id, data)
    SELECT 'source.tombstoned', NEW.changed_at, NEW.dataset, NEW.source_key, r.id, '{}'
    FROM revisions r WHERE r.id = NEW.head_revision_id AND r.tombstone = 1;
END;
CREATE TRIGGER event_source_created_deleted AFTER INSERT ON sources
BEGIN
    INSERT INTO events (type, at, dataset, source_key, revision_id, data)
    SELECT 'source.tombstoned', NEW.changed_at, NEW.dataset, NEW.source_key, r.id, '{}'
    FROM revisions r WHERE r.id = NEW.head_revision_id AND r.tombstone = 1;
END;

CREATE TRIGGER event_source_erased AFTER INSERT ON erasures
BEGIN
    INSERT INTO events (type, at, dataset, source_key, revision_id, data)
    VALUES ('source.erased', NEW.erased_at, NEW.dataset, NEW.source_key, NEW.revision_id,
            json_object('revisions_erased', NEW.revisions_erased));
END;

CREATE TRIGGER event_access_set AFTER INSERT ON source_access
BEGIN
    INSERT INTO events (type, at, dataset, source_key, revision_id, data)
    VALUES ('access.changed', NEW.changed_at, NEW.dataset, NEW.source_key, NULL,
            json_object('version', NEW.version));
END;
CREATE TRIGGER event_access_changed AFTER UPDATE ON source_access
WHEN NEW.readers IS NOT OLD.readers
BEGIN
    INSERT INTO events (type, at, dataset, source_key, revision_id, data)
    VALUES ('access.changed', NEW.changed_at, NEW.dataset, NEW.source_key, NULL,
            json_object('version', NEW.version));
END;

CREATE TRIGGER event_verify_pass_finished AFTER UPDATE OF state ON verify_passes
WHEN NEW.state = 'completed' AND OLD.state IS NOT 'completed'
BEGIN
    INSERT INTO events (type, at, dataset, source_key, revision_id, data)
    VALUES ('verify.pass.finished', NEW.changed_at, NULL, NULL, NULL,
            json_object('pass_id', NEW.id, 'tier', NEW.tier, 'generation', NEW.generation,
                        'repair', NEW.repair = 1, 'buckets_checked', NEW.buckets_checked,
                        'drift', json(NEW.drift)));
END;
CREATE TRIGGER event_verify_drift AFTER INSERT ON verify_drift
BEGIN
    INSERT INTO events (type, at, dataset, source_key, revision_id, data)
    VALUES ('verify.drift', NEW.found_at, NEW.dataset, NEW.source_key, NEW.revision_id,
            json_object('pass_id', NEW.pass_id, 'kind', NEW.kind, 'store', NEW.store,
                        'generation', NEW.generation, 'drift_id', NEW.id));
END;

CREATE TRIGGER event_generation_switched AFTER UPDATE OF state ON generations
WHEN NEW.state = 'active' AND OLD.state IS NOT 'active'
BEGIN
    INSERT INTO events (type, at, dataset, source_key, revision_id, data)
    VALUES ('generation.switched', NEW.changed_at, NULL, NULL, NULL,
            json_object('generation', NEW.id, 'from_state', OLD.state, 'model', NEW.model,
                        'dimension', NEW.dimension));
END;
