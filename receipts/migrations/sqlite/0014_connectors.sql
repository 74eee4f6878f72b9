-- cairn ledger, schema 14: connectors, which keep a dataset equal to a folder or a git tree.
--
-- - `connectors`: one row per connector; creation and every state change are recorded in
--   `history` (entity `connector`) by the triggers below, like jobs and tokens.
-- - `sources.owner`: NULL for a source that API ingest created, `connector:<id>` for one a
--   connector created. Only the owner moves a head (`receipts::acceptance`).
-- - `jobs` takes sync runs: kind `sync`, `connector_id` set and `revision_id` NULL. At most one
--   open run per connector (a unique partial index).
-- - `connector_files`: what the last committed step of a run saw of each file (a fingerprint:
--   size and mtime for a folder, the blob id for git, with its SHA-256), so that an unchanged
--   file is never read again.
-- - `sync_reports`: the report of each run, kept with its job.
--
-- SQLite cannot drop a NOT NULL or widen a CHECK with ALTER TABLE. These three changes leave
-- every stored row valid and the file format as it is, so they edit the table definitions in
-- the schema (SQLite's documented procedure for such changes, `writable_schema`), after the
-- `ADD COLUMN` on `jobs` (which places its text by the parsed definition's offsets) and
-- before the `ADD COLUMN` on `sources`, which bumps the schema cookie so that every
-- connection reloads the edited definitions. A guard aborts the migration if an edit missed.
CREATE TABLE connectors (
    id             TEXT    PRIMARY KEY,
    dataset        TEXT    NOT NULL,
    kind           TEXT    NOT NULL CHECK (kind IN ('folder', 'git')),
    location       TEXT    NOT NULL CHECK (length(location) > 0),
    git_ref        TEXT,
    include        TEXT    NOT NULL CHECK (json_valid(include)),
    exclude        TEXT    NOT NULL CHECK (json_valid(exclude)),
    max_file_bytes INTEGER NOT NULL CHECK (max_file_bytes > 0),
    interval_ms    INTEGER NOT NULL CHECK (interval_ms >= 1000),
    state          TEXT    NOT NULL CHECK (state IN ('active', 'paused', 'removed')),
    removal        TEXT    CHECK (removal IN ('keep', 'tombstone')),
    created_by     TEXT    NOT NULL,
    reason         TEXT    NOT NULL,
    created_at     INTEGER NOT NULL,
    changed_by     TEXT    NOT NULL,
    change_cause   TEXT    NOT NULL,
    changed_at     INTEGER NOT NULL,
    change_seq     INTEGER NOT NULL DEFAULT 0,
    CHECK ((kind = 'git') = (git_ref IS NOT NULL)),
    CHECK ((state = 'removed') = (removal IS NOT NULL))
) STRICT, WITHOUT ROWID;
CREATE INDEX connectors_by_dataset ON connectors(dataset);

-- A sync run names its connector and no revision; every other job a revision. A sync run's
-- `source_key` is empty (no source key is).
ALTER TABLE jobs ADD COLUMN connector_id TEXT REFERENCES connectors(id)
    CHECK ((kind = 'sync') = (connector_id IS NOT NULL)
       AND (kind = 'sync') = (revision_id IS NULL));
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
SET sql = replace(sql, 'revision_id        TEXT    NOT NULL REFERENCES revisions(id)',
                       'revision_id        TEXT    REFERENCES revisions(id)')
WHERE type = 'table' AND name = 'jobs';
UPDATE sqlite_schema
SET sql = replace(sql, 'IN (''project'', ''tombstone'', ''graph''))',
                       'IN (''project'', ''tombstone'', ''graph'', ''sync''))')
WHERE type = 'table' AND name = 'jobs';
UPDATE sqlite_schema
SET sql = replace(sql, '''pause'', ''generation''))',
                       '''pause'', ''generation'', ''connector''))')
WHERE type = 'table' AND name = 'history';
PRAGMA writable_schema = OFF;
-- Bumps the schema cookie: every connection, this one included, reloads the edited definitions.
ALTER TABLE sources ADD COLUMN owner TEXT;
CREATE INDEX sources_by_owner ON sources(owner, dataset, source_key) WHERE owner IS NOT NULL;

CREATE TEMP TABLE migration_guard (missed TEXT);
CREATE TEMP TRIGGER migration_guard_refused BEFORE INSERT ON migration_guard
BEGIN SELECT RAISE(ABORT, 'schema 14: a table definition was not edited'); END;
INSERT INTO migration_guard
SELECT name FROM sqlite_schema
WHERE (name = 'jobs' AND (instr(sql, 'NOT NULL REFERENCES revisions(id)') > 0
                          OR instr(sql, '''graph'', ''sync') = 0))
   OR (name = 'history' AND instr(sql, '''connector') = 0);
DROP TABLE migration_guard;

DROP INDEX jobs_by_revision;
CREATE INDEX jobs_by_revision ON jobs(revision_id) WHERE revision_id IS NOT NULL;
CREATE INDEX jobs_by_connector ON jobs(connector_id, created_at) WHERE connector_id IS NOT NULL;
-- Two workers never run one connector at once: one open run per connector.
CREATE UNIQUE INDEX jobs_one_open_run ON jobs(connector_id)
    WHERE connector_id IS NOT NULL AND state IN ('pending', 'running', 'retry_wait');

-- Connectors: creation and every state change.
CREATE TRIGGER connector_created AFTER INSERT ON connectors
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.changed_at, 'connector', NEW.id, 'state', NULL, NEW.state,
            NEW.changed_by, NEW.change_cause);
END;
CREATE TRIGGER connector_state_changed AFTER UPDATE OF state ON connectors
WHEN NEW.state IS NOT OLD.state
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    SELECT CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_at ELSE now_micros END,
           'connector', NEW.id, 'state', OLD.state,
           CASE WHEN NEW.state = 'removed' THEN 'removed:' || NEW.removal ELSE NEW.state END,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_by ELSE 'unattributed' END,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.change_cause ELSE 'unattributed_write' END
    FROM db_clock;
END;

CREATE TABLE connector_files (
    connector_id TEXT    NOT NULL REFERENCES connectors(id),
    source_key   TEXT    NOT NULL,
    fingerprint  TEXT    NOT NULL,
    sha256       TEXT    NOT NULL CHECK (length(sha256) = 64),
    PRIMARY KEY (connector_id, source_key)
) STRICT, WITHOUT ROWID;

CREATE TABLE sync_reports (
    job_id       TEXT    PRIMARY KEY REFERENCES jobs(id),
    connector_id TEXT    NOT NULL REFERENCES connectors(id),
    report       TEXT    NOT NULL CHECK (json_valid(report)),
    updated_at   INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
CREATE INDEX sync_reports_by_connector ON sync_reports(connector_id, updated_at);

