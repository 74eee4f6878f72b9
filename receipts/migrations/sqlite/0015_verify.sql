-- cairn ledger, schema 15: verify.
--
-- - `sources.bucket`: the source's verify bucket, `receipts::verify::bucket(dataset, key)`
--   (0..1023), written with its first acceptance and never changed. SQLite has no SHA-256, so
--   the ledger fills the rows this migration leaves NULL when it opens, in Rust.
-- - `verify_passes`: one row per pass, its cursor (the next bucket) moved with each bucket's
--   drift in one transaction, so a pass resumes where it stopped. One running pass per tier
--   and generation.
-- - `verify_drift`: one row per drift a second look confirmed, with its evidence and repair.
-- Both record their state changes in `history` (entities `verify` and `drift`; `restore` for the steps of a restore), which takes
-- the two entities through the schema edit schema 14 used (see there), made before the
-- `ADD COLUMN` that bumps the schema cookie.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
SET sql = replace(sql, '''generation'', ''connector''))',
                       '''generation'', ''connector'', ''verify'', ''drift'', ''restore''))')
WHERE type = 'table' AND name = 'history';
PRAGMA writable_schema = OFF;
ALTER TABLE sources ADD COLUMN bucket INTEGER CHECK (bucket IS NULL OR bucket BETWEEN 0 AND 1023);
CREATE INDEX sources_by_bucket ON sources(bucket, dataset, source_key);

CREATE TEMP TABLE migration_guard (missed TEXT);
CREATE TEMP TRIGGER migration_guard_refused BEFORE INSERT ON migration_guard
BEGIN SELECT RAISE(ABORT, 'schema 15: the history definition was not edited'); END;
INSERT INTO migration_guard
SELECT name FROM sqlite_schema WHERE name = 'history' AND instr(sql, '''drift''') = 0;
DROP TABLE migration_guard;

CREATE TABLE verify_passes (
    id              TEXT    PRIMARY KEY,
    tier            TEXT    NOT NULL CHECK (tier IN ('counts', 'scrub', 'deep')),
    generation      TEXT    NOT NULL REFERENCES generations(id),
    repair          INTEGER NOT NULL CHECK (repair IN (0, 1)),
    state           TEXT    NOT NULL CHECK (state IN ('running', 'completed', 'abandoned')),
    cursor          INTEGER NOT NULL CHECK (cursor BETWEEN 0 AND 1024),
    buckets_checked INTEGER NOT NULL DEFAULT 0 CHECK (buckets_checked >= 0),
    skipped         INTEGER NOT NULL DEFAULT 0 CHECK (skipped >= 0),
    drift           TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(drift)),
    created_by      TEXT    NOT NULL,
    reason          TEXT    NOT NULL,
    started_at      INTEGER NOT NULL,
    changed_by      TEXT    NOT NULL,
    change_cause    TEXT    NOT NULL,
    changed_at      INTEGER NOT NULL,
    change_seq      INTEGER NOT NULL DEFAULT 0
) STRICT, WITHOUT ROWID;
CREATE UNIQUE INDEX verify_passes_one_running ON verify_passes(tier, generation)
    WHERE state = 'running';
CREATE INDEX verify_passes_by_start ON verify_passes(started_at);

CREATE TABLE verify_drift (
    id           TEXT    PRIMARY KEY,
    pass_id      TEXT    NOT NULL REFERENCES verify_passes(id),
    kind         TEXT    NOT NULL CHECK (kind IN ('missing', 'extra', 'stale_current',
                     'wrong_dims', 'checksum', 'payload', 'replica_divergence')),
    store        TEXT    NOT NULL CHECK (store IN ('vector', 'relational', 'bytes')),
    generation   TEXT    NOT NULL,
    dataset      TEXT    NOT NULL,
    source_key   TEXT    NOT NULL,
    revision_id  TEXT    NOT NULL,
    evidence     TEXT    NOT NULL CHECK (json_valid(evidence)),
    state        TEXT    NOT NULL CHECK (state IN ('open', 'repairing', 'repaired', 'corrupt',
                     'failed')),
    repair       TEXT,
    found_at     INTEGER NOT NULL,
    changed_by   TEXT    NOT NULL,
    change_cause TEXT    NOT NULL,
    changed_at   INTEGER NOT NULL,
    change_seq   INTEGER NOT NULL DEFAULT 0
) STRICT, WITHOUT ROWID;
CREATE INDEX verify_drift_by_pass ON verify_drift(pass_id, found_at);

CREATE TRIGGER verify_pass_created AFTER INSERT ON verify_passes
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.changed_at, 'verify', NEW.id, 'state', NULL, NEW.state, NEW.changed_by,
            NEW.change_cause);
END;
CREATE TRIGGER verify_pass_state_changed AFTER UPDATE OF state ON verify_passes
WHEN NEW.state IS NOT OLD.state
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    SELECT CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_at ELSE now_micros END,
           'verify', NEW.id, 'state', OLD.state, NEW.state,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_by ELSE 'unattributed' END,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.change_cause ELSE 'unattributed_write' END
    FROM db_clock;
END;
CREATE TRIGGER verify_drift_created AFTER INSERT ON verify_drift
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.changed_at, 'drift', NEW.id, 'state', NULL, NEW.state, NEW.changed_by,
            NEW.change_cause);
END;
CREATE TRIGGER verify_drift_state_changed AFTER UPDATE OF state ON verify_drift
WHEN NEW.state IS NOT OLD.state
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    SELECT CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_at ELSE now_micros END,
           'drift', NEW.id, 'state', OLD.state, NEW.state,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_by ELSE 'unattributed' END,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.change_cause ELSE 'unattributed_write' END
    FROM db_clock;
END;
