-- cairn ledger, schema 15: verify (the same tables as SQLite's schema 15).
--
-- - `sources.bucket`: the source's verify bucket, `receipts::verify::bucket(dataset, key)`:
--   the first two bytes of SHA-256(dataset, a zero byte, key), modulo 1024. Computed here by
--   `cairn_bucket` (a trigger fills it on insert; existing rows are filled below).
-- - `verify_passes` and `verify_drift`, their state changes recorded in `history` (entities
--   `verify` and `drift`).
CREATE FUNCTION cairn_bucket(dataset text, source_key text) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT ((get_byte(h, 0) << 8) | get_byte(h, 1)) % 1024
    FROM (SELECT sha256(convert_to(dataset, 'UTF8') || decode('00', 'hex')
                        || convert_to(source_key, 'UTF8')) AS h) AS hashed
$$;

ALTER TABLE sources ADD COLUMN bucket integer CHECK (bucket IS NULL OR bucket BETWEEN 0 AND 1023);
UPDATE sources SET bucket = cairn_bucket(dataset, source_key) WHERE bucket IS NULL;
CREATE FUNCTION sources_bucket() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.bucket := cairn_bucket(NEW.dataset, NEW.source_key);
    RETURN NEW;
END $$;
CREATE TRIGGER sources_bucket BEFORE INSERT ON sources
    FOR EACH ROW EXECUTE FUNCTION sources_bucket();
CREATE INDEX sources_by_bucket ON sources (bucket, dataset, source_key COLLATE "C");

ALTER TABLE history DROP CONSTRAINT history_entity_check;
ALTER TABLE history ADD CONSTRAINT history_entity_check CHECK (entity IN ('source', 'job',
    'receipt', 'block', 'token', 'pause', 'generation', 'connector', 'verify', 'drift', 'restore'));

CREATE TABLE verify_passes (
    id              uuid    PRIMARY KEY,
    tier            text    NOT NULL CHECK (tier IN ('counts', 'scrub', 'deep')),
    generation      text    NOT NULL REFERENCES generations(id),
    repair          boolean NOT NULL,
    state           text    NOT NULL CHECK (state IN ('running', 'completed', 'abandoned')),
    cursor          bigint  NOT NULL CHECK (cursor BETWEEN 0 AND 1024),
    buckets_checked bigint  NOT NULL DEFAULT 0 CHECK (buckets_checked >= 0),
    skipped         bigint  NOT NULL DEFAULT 0 CHECK (skipped >= 0),
    drift           jsonb   NOT NULL DEFAULT '{}',
    created_by      text    NOT NULL,
    reason          text    NOT NULL,
    started_at      bigint  NOT NULL,
    changed_by      text    NOT NULL,
    change_cause    text    NOT NULL,
    changed_at      bigint  NOT NULL,
    change_seq      bigint  NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX verify_passes_one_running ON verify_passes (tier, generation)
    WHERE state = 'running';
CREATE INDEX verify_passes_by_start ON verify_passes (started_at);

CREATE TABLE verify_drift (
    id           uuid   PRIMARY KEY,
    pass_id      uuid   NOT NULL REFERENCES verify_passes(id),
    kind         text   NOT NULL CHECK (kind IN ('missing', 'extra', 'stale_current',
                     'wrong_dims', 'checksum', 'payload', 'replica_divergence')),
    store        text   NOT NULL CHECK (store IN ('vector', 'relational', 'bytes')),
    generation   text   NOT NULL,
    dataset      text   NOT NULL,
    source_key   text   NOT NULL,
    revision_id  uuid   NOT NULL,
    evidence     jsonb  NOT NULL,
    state        text   NOT NULL CHECK (state IN ('open', 'repairing', 'repaired', 'corrupt',
                     'failed')),
    repair       text,
    found_at     bigint NOT NULL,
    changed_by   text   NOT NULL,
    change_cause text   NOT NULL,
    changed_at   bigint NOT NULL,
    change_seq   bigint NOT NULL DEFAULT 0
);
CREATE INDEX verify_drift_by_pass ON verify_drift (pass_id, found_at);

CREATE FUNCTION verify_history() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    entity text := CASE WHEN TG_TABLE_NAME = 'verify_passes' THEN 'verify' ELSE 'drift' END;
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM history_add(true, NEW.changed_at, entity, NEW.id::text, 'state', NULL,
            NEW.state, NEW.changed_by, NEW.change_cause);
    ELSE
        PERFORM history_add(NEW.change_seq > OLD.change_seq, NEW.changed_at, entity,
            NEW.id::text, 'state', OLD.state, NEW.state, NEW.changed_by, NEW.change_cause);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER verify_pass_created AFTER INSERT ON verify_passes
    FOR EACH ROW EXECUTE FUNCTION verify_history();
CREATE TRIGGER verify_pass_state_changed AFTER UPDATE ON verify_passes FOR EACH ROW
    WHEN (NEW.state IS DISTINCT FROM OLD.state) EXECUTE FUNCTION verify_history();
CREATE TRIGGER verify_drift_created AFTER INSERT ON verify_drift
    FOR EACH ROW EXECUTE FUNCTION verify_history();
CREATE TRIGGER verify_drift_state_changed AFTER UPDATE ON verify_drift FOR EACH ROW
    WHEN (NEW.state IS DISTINCT FROM OLD.state) EXECUTE FUNCTION verify_history();
