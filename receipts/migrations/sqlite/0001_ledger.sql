-- cairn ledger, schema 1.
--
-- Times are integer epoch microseconds (UTC). Every state column carries a CHECK constraint.
-- History is written by triggers, not by application code: a state or head change made by any
-- statement, including raw SQL issued outside cairn, lands in `history`. cairn's own writes set
-- `changed_by`, `change_cause`, `changed_at` and bump `change_seq` in the same UPDATE; a write
-- that does not bump `change_seq` is recorded as actor `unattributed` at the database's own clock.

CREATE TABLE contents (
    sha256       TEXT    PRIMARY KEY CHECK (length(sha256) = 64),
    byte_length  INTEGER NOT NULL CHECK (byte_length >= 0),
    bytes        BLOB    NOT NULL,
    created_at   INTEGER NOT NULL,
    CHECK (length(bytes) = byte_length)
) STRICT;

CREATE TABLE revisions (
    id                   TEXT    PRIMARY KEY,
    dataset              TEXT    NOT NULL,
    source_key           TEXT    NOT NULL,
    content_sha256       TEXT    REFERENCES contents(sha256),
    byte_length          INTEGER NOT NULL CHECK (byte_length >= 0),
    media_type           TEXT    NOT NULL,
    tags                 TEXT    NOT NULL DEFAULT '[]' CHECK (json_valid(tags)),
    metadata             TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(metadata)),
    tombstone            INTEGER NOT NULL CHECK (tombstone IN (0, 1)),
    previous_revision_id TEXT    REFERENCES revisions(id),
    actor                TEXT    NOT NULL,
    reason               TEXT,
    accepted_at          INTEGER NOT NULL,
    CHECK ((tombstone = 1) = (content_sha256 IS NULL))
) STRICT, WITHOUT ROWID;
CREATE INDEX revisions_by_source ON revisions(dataset, source_key, accepted_at);

CREATE TABLE sources (
    dataset          TEXT    NOT NULL,
    source_key       TEXT    NOT NULL,
    head_revision_id TEXT    NOT NULL REFERENCES revisions(id),
    created_at       INTEGER NOT NULL,
    changed_by       TEXT    NOT NULL,
    change_cause     TEXT    NOT NULL,
    changed_at       INTEGER NOT NULL,
    change_seq       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (dataset, source_key)
) STRICT, WITHOUT ROWID;

CREATE TABLE jobs (
    id                 TEXT    PRIMARY KEY,
    revision_id        TEXT    NOT NULL REFERENCES revisions(id),
    dataset            TEXT    NOT NULL,
    source_key         TEXT    NOT NULL,
    kind               TEXT    NOT NULL CHECK (kind IN ('project', 'tombstone')),
    state              TEXT    NOT NULL CHECK (state IN ('pending', 'running', 'retry_wait',
                           'completed', 'dead', 'cancelled', 'superseded', 'quarantined')),
    priority           INTEGER NOT NULL DEFAULT 0,
    attempt            INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts       INTEGER NOT NULL CHECK (max_attempts >= 1),
    crashes            INTEGER NOT NULL DEFAULT 0 CHECK (crashes >= 0),
    run_at             INTEGER NOT NULL,
    lease_id           TEXT,
    lease_owner        TEXT,
    lease_expires_at   INTEGER,
    heartbeat_at       INTEGER,
    deadline_at        INTEGER,
    last_error_code    TEXT,
    last_error_message TEXT,
    created_at         INTEGER NOT NULL,
    changed_by         TEXT    NOT NULL,
    change_cause       TEXT    NOT NULL,
    changed_at         INTEGER NOT NULL,
    change_seq         INTEGER NOT NULL DEFAULT 0,
    -- A lease is whole or absent, and only a running job holds one.
    CHECK ((lease_id IS NULL) = (lease_owner IS NULL)
       AND (lease_id IS NULL) = (lease_expires_at IS NULL)),
    CHECK (state = 'running' OR lease_id IS NULL)
) STRICT, WITHOUT ROWID;
CREATE INDEX jobs_by_revision ON jobs(revision_id);
CREATE INDEX jobs_by_source ON jobs(dataset, source_key);
CREATE INDEX jobs_claimable ON jobs(state, priority, run_at) WHERE state IN ('pending', 'retry_wait');

CREATE TABLE projection_receipts (
    job_id       TEXT    NOT NULL REFERENCES jobs(id),
    backend      TEXT    NOT NULL CHECK (backend IN ('relational', 'vector', 'graph')),
    state        TEXT    NOT NULL CHECK (state IN ('pending', 'running', 'written', 'verified',
                     'excluded', 'failed', 'superseded')),
    evidence     TEXT    CHECK (evidence IS NULL OR json_valid(evidence)),
    updated_at   INTEGER NOT NULL,
    changed_by   TEXT    NOT NULL,
    change_cause TEXT    NOT NULL,
    changed_at   INTEGER NOT NULL,
    change_seq   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, backend)
) STRICT, WITHOUT ROWID;

CREATE TABLE content_blocks (
    dataset    TEXT    NOT NULL,
    sha256     TEXT    NOT NULL CHECK (length(sha256) = 64),
    reason     TEXT    NOT NULL,
    actor      TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (dataset, sha256)
) STRICT, WITHOUT ROWID;

CREATE TABLE tokens (
    id         TEXT    PRIMARY KEY,
    name       TEXT    NOT NULL,
    sha256     TEXT    NOT NULL UNIQUE CHECK (length(sha256) = 64),
    scopes     TEXT    NOT NULL CHECK (json_valid(scopes)),
    datasets   TEXT    CHECK (datasets IS NULL OR json_valid(datasets)),
    created_by TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
) STRICT, WITHOUT ROWID;

-- Append-only trail. `entity` names the table; `event` the kind of change.
CREATE TABLE history (
    seq        INTEGER PRIMARY KEY, -- rowid: rows are never deleted, so it only grows
    at         INTEGER NOT NULL,
    entity     TEXT    NOT NULL CHECK (entity IN ('source', 'job', 'receipt', 'block', 'token', 'pause', 'generation')),
    entity_id  TEXT    NOT NULL,
    event      TEXT    NOT NULL,
    from_state TEXT,
    to_state   TEXT,
    actor      TEXT    NOT NULL,
    cause      TEXT    NOT NULL
) STRICT;
CREATE INDEX history_by_entity ON history(entity, entity_id, seq);

CREATE TRIGGER history_no_update BEFORE UPDATE ON history
BEGIN SELECT RAISE(ABORT, 'history is append-only'); END;
CREATE TRIGGER history_no_delete BEFORE DELETE ON history
BEGIN SELECT RAISE(ABORT, 'history is append-only'); END;

-- The database's own clock, used only for writes that did not say when they happened.
CREATE VIEW db_clock AS
SELECT CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER) AS now_micros;

-- Sources: creation and every head move.
CREATE TRIGGER source_created AFTER INSERT ON sources
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.changed_at, 'source', NEW.dataset || '/' || NEW.source_key, 'head_moved',
            NULL, NEW.head_revision_id, NEW.changed_by, NEW.change_cause);
END;
CREATE TRIGGER source_head_moved AFTER UPDATE OF head_revision_id ON sources
WHEN NEW.head_revision_id IS NOT OLD.head_revision_id
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    SELECT CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_at ELSE now_micros END,
           'source', NEW.dataset || '/' || NEW.source_key, 'head_moved',
           OLD.head_revision_id, NEW.head_revision_id,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_by ELSE 'unattributed' END,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.change_cause ELSE 'unattributed_write' END
    FROM db_clock;
END;

-- Jobs: creation and every state change.
CREATE TRIGGER job_created AFTER INSERT ON jobs
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.changed_at, 'job', NEW.id, 'state', NULL, NEW.state,
            NEW.changed_by, NEW.change_cause);
END;
CREATE TRIGGER job_state_changed AFTER UPDATE OF state ON jobs
WHEN NEW.state IS NOT OLD.state
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    SELECT CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_at ELSE now_micros END,
           'job', NEW.id, 'state', OLD.state, NEW.state,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_by ELSE 'unattributed' END,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.change_cause ELSE 'unattributed_write' END
    FROM db_clock;
END;

-- Receipts: creation and every state change.
CREATE TRIGGER receipt_created AFTER INSERT ON projection_receipts
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.changed_at, 'receipt', NEW.job_id || '/' || NEW.backend, 'state', NULL, NEW.state,
            NEW.changed_by, NEW.change_cause);
END;
CREATE TRIGGER receipt_state_changed AFTER UPDATE OF state ON projection_receipts
WHEN NEW.state IS NOT OLD.state
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    SELECT CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_at ELSE now_micros END,
           'receipt', NEW.job_id || '/' || NEW.backend, 'state', OLD.state, NEW.state,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_by ELSE 'unattributed' END,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.change_cause ELSE 'unattributed_write' END
    FROM db_clock;
END;

-- Content blocks: added and lifted.
CREATE TRIGGER block_added AFTER INSERT ON content_blocks
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.created_at, 'block', NEW.dataset || '/' || NEW.sha256, 'blocked', NULL, 'blocked',
            NEW.actor, NEW.reason);
END;
CREATE TRIGGER block_lifted AFTER DELETE ON content_blocks
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    SELECT now_micros, 'block', OLD.dataset || '/' || OLD.sha256, 'unblocked', 'blocked', NULL,
           'unattributed', 'unblocked'
    FROM db_clock;
END;

CREATE TRIGGER token_created AFTER INSERT ON tokens
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.created_at, 'token', NEW.id, 'created', NULL, NEW.scopes, NEW.created_by, NEW.name);
END;
CREATE TRIGGER token_revoked AFTER UPDATE OF revoked_at ON tokens
WHEN NEW.revoked_at IS NOT NULL AND OLD.revoked_at IS NULL
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.revoked_at, 'token', NEW.id, 'revoked', OLD.scopes, NULL, 'unattributed', 'revoked');
END;

-- Lexical index: passages of current heads only. `passages` holds each passage's byte range in
-- its retained content (the text is not stored twice); the FTS5 index is contentless and
-- follows `passages` through a trigger, so removing a source's passages removes its index rows.
CREATE TABLE passages (
    id            INTEGER PRIMARY KEY,
    dataset       TEXT    NOT NULL,
    source_key    TEXT    NOT NULL,
    revision_id   TEXT    NOT NULL REFERENCES revisions(id),
    passage_index INTEGER NOT NULL CHECK (passage_index >= 0),
    byte_start    INTEGER NOT NULL CHECK (byte_start >= 0),
    byte_end      INTEGER NOT NULL CHECK (byte_end > byte_start),
    UNIQUE (revision_id, passage_index)
) STRICT;
CREATE INDEX passages_by_source ON passages(dataset, source_key);

CREATE VIRTUAL TABLE passages_fts USING fts5(
    text, content = '', contentless_delete = 1, tokenize = 'porter unicode61'
);
CREATE TRIGGER passages_ad AFTER DELETE ON passages BEGIN
    DELETE FROM passages_fts WHERE rowid = OLD.id;
END;
