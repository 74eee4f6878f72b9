-- cairn ledger (PostgreSQL), schema 23: the events outbox (as SQLite schema 22).
--
-- The same events, written by triggers in the transaction that makes the change. Sequence
-- order must be commit order, or a consumer reading `after` its cursor could skip an event
-- that committed late with a lower number. So an event's row is inserted without a number,
-- and a deferred constraint trigger numbers the transaction's events at its commit, under a
-- transaction-scoped advisory lock: one committing transaction numbers its events at a time,
-- and the lock is taken when the transaction holds every other lock it will hold, so it waits
-- only for other commits, which wait for nothing. Readers see numbered rows only.
CREATE TABLE events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    seq         bigint UNIQUE,
    type        text   NOT NULL CHECK (type IN ('receipt.verified', 'receipt.failed',
                    'job.dead', 'source.superseded', 'source.tombstoned', 'source.erased',
                    'access.changed', 'connector.run.finished', 'verify.drift',
                    'verify.pass.finished', 'generation.switched')),
    at          bigint NOT NULL,
    dataset     text,
    source_key  text,
    revision_id text,
    data        jsonb  NOT NULL DEFAULT '{}'
);
CREATE SEQUENCE events_seq;
CREATE INDEX events_by_dataset ON events (dataset, seq);
CREATE INDEX events_by_time ON events (at);

CREATE TABLE events_pruned (
    id      integer PRIMARY KEY CHECK (id = 1),
    through bigint  NOT NULL
);
INSERT INTO events_pruned (id, through) VALUES (1, 0);

-- 0x63616972 ('cair') and 0x6e657673 ('nevs'): the lock that orders the numbering.
CREATE FUNCTION events_number() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1667328370, 1852143219);
    UPDATE events SET seq = nextval('events_seq') WHERE id = NEW.id;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER events_number AFTER INSERT ON events
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION events_number();

CREATE FUNCTION event_receipt_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'verified' THEN
        INSERT INTO events (type, at, dataset, source_key, revision_id, data)
        SELECT 'receipt.verified', NEW.changed_at, j.dataset, j.source_key, j.revision_id::text,
               jsonb_build_object('job_id', j.id::text, 'backend', NEW.backend,
                                  'generation', NEW.generation)
        FROM jobs j WHERE j.id = NEW.job_id;
        INSERT INTO events (type, at, dataset, source_key, revision_id, data)
        SELECT 'receipt.verified', NEW.changed_at, j.dataset, j.source_key, j.revision_id::text,
               jsonb_build_object('job_id', j.id::text, 'backend', 'all',
                                  'generation', NEW.generation,
                                  'backends', (SELECT jsonb_agg(r.backend ORDER BY r.backend)
                                               FROM projection_receipts r
                                               WHERE r.job_id = j.id AND r.state = 'verified'))
        FROM jobs j WHERE j.id = NEW.job_id
          AND NOT EXISTS (SELECT 1 FROM projection_receipts r
                          WHERE r.job_id = j.id AND r.state NOT IN ('verified', 'excluded'));
    ELSIF NEW.state = 'failed' THEN
        INSERT INTO events (type, at, dataset, source_key, revision_id, data)
        SELECT 'receipt.failed', NEW.changed_at, j.dataset, j.source_key, j.revision_id::text,
               jsonb_build_object('job_id', j.id::text, 'backend', NEW.backend,
                                  'generation', NEW.generation)
        FROM jobs j WHERE j.id = NEW.job_id;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER event_receipt_changed AFTER UPDATE OF state ON projection_receipts FOR EACH ROW
    WHEN (NEW.state IN ('verified', 'failed') AND NEW.state IS DISTINCT FROM OLD.state)
    EXECUTE FUNCTION event_receipt_changed();

CREATE FUNCTION event_job_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'dead' THEN
        INSERT INTO events (type, at, dataset, source_key, revision_id, data)
        VALUES ('job.dead', NEW.changed_at, NEW.dataset, NULLIF(NEW.source_key, ''),
                NEW.revision_id::text,
                jsonb_build_object('job_id', NEW.id::text, 'kind', NEW.kind,
                                   'attempt', NEW.attempt, 'error_code', NEW.last_error_code));
    END IF;
    IF NEW.kind = 'sync' THEN
        INSERT INTO events (type, at, dataset, source_key, revision_id, data)
        VALUES ('connector.run.finished', NEW.changed_at, NEW.dataset, NULL, NULL,
                jsonb_build_object('job_id', NEW.id::text,
                                   'connector_id', NEW.connector_id::text,
                                   'outcome', NEW.state,
                                   'report', (SELECT s.report FROM sync_reports s
                                              WHERE s.job_id = NEW.id)));
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER event_job_ended AFTER UPDATE OF state ON jobs FOR EACH ROW
    WHEN (NEW.state IS DISTINCT FROM OLD.state
          AND (NEW.state = 'dead' OR (NEW.kind = 'sync' AND NEW.state = 'completed')))
    EXECUTE FUNCTION event_job_ended();

CREATE FUNCTION event_source_head() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        INSERT INTO events (type, at, dataset, source_key, revision_id, data)
        VALUES ('source.superseded', NEW.changed_at, NEW.dataset, NEW.source_key,
                OLD.head_revision_id::text,
                jsonb_build_object('superseded_by', NEW.head_revision_id::text));
    END IF;
    INSERT INTO events (type, at, dataset, source_key, revision_id, data)
    SELECT 'source.tombstoned', NEW.changed_at, NEW.dataset, NEW.source_key, r.id::text, '{}'
    FROM revisions r WHERE r.id = NEW.head_revision_id AND r.tombstone;
    RETURN NULL;
END $$;
CREATE TRIGGER event_source_head_moved AFTER UPDATE OF head_revision_id ON sources FOR EACH ROW
    WHEN (NEW.head_revision_id IS DISTINCT FROM OLD.head_revision_id)
    EXECUTE FUNCTION event_source_head();
CREATE TRIGGER event_source_created_deleted AFTER INSERT ON sources FOR EACH ROW
    EXECUTE FUNCTION event_source_head();

CREATE FUNCTION event_source_erased() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (type, at, dataset, source_key, revision_id, data)
    VALUES ('source.erased', NEW.erased_at, NEW.dataset, NEW.source_key, NEW.revision_id::text,
            jsonb_build_object('revisions_erased', NEW.revisions_erased));
    RETURN NULL;
END $$;
CREATE TRIGGER event_source_erased AFTER INSERT ON erasures FOR EACH ROW
    EXECUTE FUNCTION event_source_erased();

CREATE FUNCTION event_access_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.readers IS NOT DISTINCT FROM OLD.readers THEN
        RETURN NULL;
    END IF;
    INSERT INTO events (type, at, dataset, source_key, revision_id, data)
    VALUES ('access.changed', NEW.changed_at, NEW.dataset, NEW.source_key, NULL,
            jsonb_build_object('version', NEW.version));
    RETURN NULL;
END $$;
CREATE TRIGGER event_access_changed AFTER INSERT OR UPDATE ON source_access FOR EACH ROW
    EXECUTE FUNCTION event_access_changed();

CREATE FUNCTION event_verify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'verify_passes' THEN
        INSERT INTO events (type, at, dataset, source_key, revision_id, data)
        VALUES ('verify.pass.finished', NEW.changed_at, NULL, NULL, NULL,
                jsonb_build_object('pass_id', NEW.id::text, 'tier', NEW.tier,
                                   'generation', NEW.generation, 'repair', NEW.repair,
                                   'buckets_checked', NEW.buckets_checked,
                                   'drift', NEW.drift));
    ELSE
        INSERT INTO events (type, at, dataset, source_key, revision_id, data)
        VALUES ('verify.drift', NEW.found_at, NEW.dataset, NEW.source_key,
                NEW.revision_id::text,
                jsonb_build_object('pass_id', NEW.pass_id::text, 'kind', NEW.kind,
                                   'store', NEW.store, 'generation', NEW.generation,
                                   'drift_id', NEW.id::text));
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER event_verify_pass_finished AFTER UPDATE OF state ON verify_passes FOR EACH ROW
    WHEN (NEW.state = 'completed' AND OLD.state IS DISTINCT FROM 'completed')
    EXECUTE FUNCTION event_verify();
CREATE TRIGGER event_verify_drift AFTER INSERT ON verify_drift FOR EACH ROW
    EXECUTE FUNCTION event_verify();

CREATE FUNCTION event_generation_switched() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (type, at, dataset, source_key, revision_id, data)
    VALUES ('generation.switched', NEW.changed_at, NULL, NULL, NULL,
            jsonb_build_object('generation', NEW.id, 'from_state', OLD.state,
                               'model', NEW.model, 'dimension', NEW.dimension));
    RETURN NULL;
END $$;
CREATE TRIGGER event_generation_switched AFTER UPDATE OF state ON generations FOR EACH ROW
    WHEN (NEW.state = 'active' AND OLD.state IS DISTINCT FROM 'active')
    EXECUTE FUNCTION event_generation_switched();
