-- cairn ledger (PostgreSQL), schema 20: who may read which document (as SQLite schema 19; see
-- `receipts::access`).
--
-- - `tokens.principal` and `tokens.groups`: the identity a token reads as. NULL: a token that
--   reads its whole datasets, as every token made before this schema does.
-- - `source_access`: a source's readers, when a put or an access change named them, keyed by
--   the source's key: changing who may read is not a new revision. A source without a row
--   follows its dataset's default.
-- - `dataset_access`: a dataset's default for sources that name no readers; a dataset without
--   a row is open to everyone who may read it.
-- Both record every change in `history` (entity `access`) by the trigger below.
ALTER TABLE tokens ADD COLUMN principal text;
ALTER TABLE tokens ADD COLUMN groups jsonb;

ALTER TABLE history DROP CONSTRAINT history_entity_check;
ALTER TABLE history ADD CONSTRAINT history_entity_check CHECK (entity IN ('source', 'job',
    'receipt', 'block', 'token', 'pause', 'generation', 'connector', 'verify', 'drift', 'restore',
    'access'));

CREATE TABLE source_access (
    dataset      text   NOT NULL,
    source_key   text   NOT NULL,
    readers      jsonb  NOT NULL CHECK (jsonb_typeof(readers) = 'array'),
    version      bigint NOT NULL CHECK (version >= 1),
    changed_by   text   NOT NULL,
    change_cause text   NOT NULL,
    changed_at   bigint NOT NULL,
    PRIMARY KEY (dataset, source_key)
);

CREATE TABLE dataset_access (
    dataset        text   PRIMARY KEY,
    default_access text   NOT NULL CHECK (default_access IN ('everyone', 'nobody')),
    changed_by     text   NOT NULL,
    change_cause   text   NOT NULL,
    changed_at     bigint NOT NULL
);

CREATE FUNCTION source_access_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM history_add(true, NEW.changed_at, 'access', NEW.dataset || '/' || NEW.source_key,
        'readers', CASE WHEN TG_OP = 'UPDATE' THEN OLD.readers::text END, NEW.readers::text,
        NEW.changed_by, NEW.change_cause);
    RETURN NULL;
END $$;
CREATE TRIGGER source_access_history AFTER INSERT OR UPDATE ON source_access
    FOR EACH ROW EXECUTE FUNCTION source_access_history();

CREATE FUNCTION dataset_access_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM history_add(true, NEW.changed_at, 'access', NEW.dataset, 'default',
        CASE WHEN TG_OP = 'UPDATE' THEN OLD.default_access END, NEW.default_access,
        NEW.changed_by, NEW.change_cause);
    RETURN NULL;
END $$;
CREATE TRIGGER dataset_access_history AFTER INSERT OR UPDATE ON dataset_access
    FOR EACH ROW EXECUTE FUNCTION dataset_access_history();
