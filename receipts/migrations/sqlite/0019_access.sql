-- cairn ledger, schema 19: who may read which document (`receipts::access`).
--
-- - `tokens.principal` and `tokens.groups`: the identity a token reads as (`user:<name>` or
--   `service:<name>`, and `group:<name>`s). NULL: a token that reads its whole datasets, as
--   every token made before this schema does.
-- - `source_access`: a source's readers, when a put or an access change named them. Keyed by
--   the source's key, not its revision: changing who may read is not a new revision. A source
--   without a row follows its dataset's default.
-- - `dataset_access`: a dataset's default for sources that name no readers; a dataset without
--   a row is open to everyone who may read it.
-- Both record every change in `history` (entity `access`) by the triggers below, with the
-- actor and reason carried on the row; `history` takes the entity through the schema edit
-- schema 14 used (see there), made before the `ADD COLUMN` that bumps the schema cookie.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
SET sql = replace(sql, '''drift'', ''restore''))',
                       '''drift'', ''restore'', ''access''))')
WHERE type = 'table' AND name = 'history';
PRAGMA writable_schema = OFF;
ALTER TABLE tokens ADD COLUMN principal TEXT;
ALTER TABLE tokens ADD COLUMN groups TEXT CHECK (groups IS NULL OR json_valid(groups));

CREATE TEMP TABLE migration_guard (missed TEXT);
CREATE TEMP TRIGGER migration_guard_refused BEFORE INSERT ON migration_guard
BEGIN SELECT RAISE(ABORT, 'schema 19: the history definition was not edited'); END;
INSERT INTO migration_guard
SELECT name FROM sqlite_schema WHERE name = 'history' AND instr(sql, '''access''') = 0;
DROP TABLE migration_guard;

CREATE TABLE source_access (
    dataset      TEXT    NOT NULL,
    source_key   TEXT    NOT NULL,
    readers      TEXT    NOT NULL CHECK (json_valid(readers) AND json_type(readers) = 'array'),
    version      INTEGER NOT NULL CHECK (version >= 1),
    changed_by   TEXT    NOT NULL,
    change_cause TEXT    NOT NULL,
    changed_at   INTEGER NOT NULL,
    PRIMARY KEY (dataset, source_key)
) STRICT, WITHOUT ROWID;

CREATE TABLE dataset_access (
    dataset        TEXT    PRIMARY KEY,
    default_access TEXT    NOT NULL CHECK (default_access IN ('everyone', 'nobody')),
    changed_by     TEXT    NOT NULL,
    change_cause   TEXT    NOT NULL,
    changed_at     INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

CREATE TRIGGER source_access_set AFTER INSERT ON source_access
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.changed_at, 'access', NEW.dataset || '/' || NEW.source_key, 'readers', NULL,
            NEW.readers, NEW.changed_by, NEW.change_cause);
END;
CREATE TRIGGER source_access_changed AFTER UPDATE ON source_access
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.changed_at, 'access', NEW.dataset || '/' || NEW.source_key, 'readers',
            OLD.readers, NEW.readers, NEW.changed_by, NEW.change_cause);
END;
CREATE TRIGGER dataset_access_set AFTER INSERT ON dataset_access
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.changed_at, 'access', NEW.dataset, 'default', NULL, NEW.default_access,
            NEW.changed_by, NEW.change_cause);
END;
CREATE TRIGGER dataset_access_changed AFTER UPDATE ON dataset_access
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.changed_at, 'access', NEW.dataset, 'default', OLD.default_access,
            NEW.default_access, NEW.changed_by, NEW.change_cause);
END;
