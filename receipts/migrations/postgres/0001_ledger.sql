-- cairn ledger on PostgreSQL, schema 1: the same model and invariants as the SQLite ledger
-- (receipts/migrations/sqlite), in PostgreSQL's types and PL/pgSQL triggers.
--
-- Times are bigint epoch microseconds (UTC). Every state column carries a CHECK constraint.
-- History is written by triggers, not by application code: a state or head change made by any
-- statement, including raw SQL from psql, lands in `history`. cairn's own writes set
-- `changed_by`, `change_cause`, `changed_at` and bump `change_seq` in the same UPDATE; a write
-- that does not bump `change_seq` is recorded as actor `unattributed` at the database's clock.

-- The database's clock in epoch microseconds: the time of lease writes when the ledger runs on
-- the database's clock (production), and of unattributed history rows.
CREATE FUNCTION cairn_db_now() RETURNS bigint LANGUAGE sql VOLATILE AS
$$ SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint $$;

CREATE TABLE contents (
    sha256       text   PRIMARY KEY CHECK (length(sha256) = 64),
    byte_length  bigint NOT NULL CHECK (byte_length >= 0),
    bytes        bytea  NOT NULL,
    created_at   bigint NOT NULL,
    CHECK (octet_length(bytes) = byte_length)
);
-- Content is written once and read whole; keep it out of the TOAST compressor's way.
ALTER TABLE contents ALTER COLUMN bytes SET STORAGE EXTERNAL;

CREATE TABLE revisions (
    id                   uuid    PRIMARY KEY,
    dataset              text    NOT NULL,
    source_key           text    NOT NULL,
    content_sha256       text    REFERENCES contents(sha256),
    byte_length          bigint  NOT NULL CHECK (byte_length >= 0),
    media_type           text    NOT NULL,
    tags                 jsonb   NOT NULL DEFAULT '[]',
    metadata             jsonb   NOT NULL DEFAULT '{}',
    tombstone            boolean NOT NULL,
    previous_revision_id uuid    REFERENCES revisions(id),
    actor                text    NOT NULL,
    reason               text,
    accepted_at          bigint  NOT NULL,
    CHECK (tombstone = (content_sha256 IS NULL))
);
CREATE INDEX revisions_by_source ON revisions (dataset, source_key, accepted_at);

CREATE TABLE sources (
    dataset          text   NOT NULL,
    source_key       text   NOT NULL,
    head_revision_id uuid   NOT NULL REFERENCES revisions(id),
    created_at       bigint NOT NULL,
    changed_by       text   NOT NULL,
    change_cause     text   NOT NULL,
    changed_at       bigint NOT NULL,
    change_seq       bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (dataset, source_key)
);

CREATE TABLE jobs (
    id                 uuid    PRIMARY KEY,
    revision_id        uuid    NOT NULL REFERENCES revisions(id),
    dataset            text    NOT NULL,
    source_key         text    NOT NULL,
    kind               text    NOT NULL CHECK (kind IN ('project', 'tombstone')),
    state              text    NOT NULL CHECK (state IN ('pending', 'running', 'retry_wait',
                           'completed', 'dead', 'cancelled', 'superseded', 'quarantined')),
    priority           bigint  NOT NULL DEFAULT 0,
    attempt            bigint  NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts       bigint  NOT NULL CHECK (max_attempts >= 1),
    crashes            bigint  NOT NULL DEFAULT 0 CHECK (crashes >= 0),
    run_at             bigint  NOT NULL,
    run_at_rule        text    NOT NULL DEFAULT 'accepted',
    lease_id           text,
    lease_owner        text,
    lease_expires_at   bigint,
    heartbeat_at       bigint,
    deadline_at        bigint,
    started_at         bigint,
    first_started_at   bigint,
    cancel_requested   boolean NOT NULL DEFAULT false,
    stage              text,
    stage_at           bigint,
    last_error_code    text,
    last_error_message text,
    created_at         bigint  NOT NULL,
    changed_by         text    NOT NULL,
    change_cause       text    NOT NULL,
    changed_at         bigint  NOT NULL,
    change_seq         bigint  NOT NULL DEFAULT 0,
    -- A lease is whole or absent, and only a running job holds one.
    CHECK ((lease_id IS NULL) = (lease_owner IS NULL)
       AND (lease_id IS NULL) = (lease_expires_at IS NULL)),
    CHECK (state = 'running' OR lease_id IS NULL)
);
CREATE INDEX jobs_by_revision ON jobs (revision_id);
CREATE INDEX jobs_by_source ON jobs (dataset, source_key);
-- Claims take each dataset's first due jobs from this index.
CREATE INDEX jobs_claim_by_dataset ON jobs (dataset, priority DESC, run_at, id)
    WHERE state IN ('pending', 'retry_wait');
CREATE INDEX jobs_running_expiry ON jobs (lease_expires_at) WHERE state = 'running';
-- A queue table churns: every claim and completion leaves a dead row version and dead entries
-- in the claim index, which later claims walk over until vacuum removes them. Vacuum the jobs
-- table after 1% of it (or 1,000 rows) changed, without the cost-based pauses.
ALTER TABLE jobs SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
                      autovacuum_vacuum_cost_delay = 0, autovacuum_analyze_scale_factor = 0.02);
CREATE INDEX jobs_by_first_start ON jobs (first_started_at) WHERE first_started_at IS NOT NULL;
CREATE INDEX jobs_by_error ON jobs (last_error_code) WHERE last_error_code IS NOT NULL;
CREATE INDEX jobs_completed ON jobs (changed_at) WHERE state = 'completed' AND kind = 'project';

CREATE TABLE generations (
    id         text    PRIMARY KEY,
    model      text    NOT NULL,
    dimension  bigint  NOT NULL CHECK (dimension > 0),
    chunker    text    NOT NULL,
    backends   jsonb   NOT NULL,
    active     boolean NOT NULL,
    created_at bigint  NOT NULL,
    created_by text    NOT NULL
);
CREATE UNIQUE INDEX generations_one_active ON generations (active) WHERE active;

CREATE TABLE projection_receipts (
    job_id       uuid   NOT NULL REFERENCES jobs(id),
    backend      text   NOT NULL CHECK (backend IN ('relational', 'vector', 'graph')),
    state        text   NOT NULL CHECK (state IN ('pending', 'running', 'written', 'verified',
                     'excluded', 'failed', 'superseded')),
    evidence     jsonb,
    generation   text   REFERENCES generations(id),
    updated_at   bigint NOT NULL,
    changed_by   text   NOT NULL,
    change_cause text   NOT NULL,
    changed_at   bigint NOT NULL,
    change_seq   bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, backend)
);

CREATE TABLE content_blocks (
    dataset    text   NOT NULL,
    sha256     text   NOT NULL CHECK (length(sha256) = 64),
    reason     text   NOT NULL,
    actor      text   NOT NULL,
    created_at bigint NOT NULL,
    PRIMARY KEY (dataset, sha256)
);

CREATE TABLE tokens (
    id            uuid   PRIMARY KEY,
    name          text   NOT NULL,
    sha256        text   NOT NULL UNIQUE CHECK (length(sha256) = 64),
    scopes        jsonb  NOT NULL,
    datasets      jsonb,
    created_by    text   NOT NULL,
    created_at    bigint NOT NULL,
    expires_at    bigint,
    revoked_at    bigint,
    revoked_by    text,
    revoke_reason text,
    replaced_by   uuid
);

-- Claiming is paused for a dataset, or for all of them ('*'). A resume first stamps
-- changed_by/change_cause/changed_at, then deletes the row, so the trigger can attribute it.
CREATE TABLE claim_pauses (
    dataset      text   PRIMARY KEY,
    reason       text   NOT NULL,
    actor        text   NOT NULL,
    created_at   bigint NOT NULL,
    changed_by   text   NOT NULL,
    change_cause text   NOT NULL,
    changed_at   bigint NOT NULL
);

-- Chunk rows of a revision (the relational backend), replaced whole by a fenced write.
CREATE TABLE chunks (
    revision_id uuid   NOT NULL REFERENCES revisions(id),
    chunk_index bigint NOT NULL CHECK (chunk_index >= 0),
    text        text   NOT NULL,
    byte_start  bigint NOT NULL CHECK (byte_start >= 0),
    byte_end    bigint NOT NULL CHECK (byte_end >= byte_start),
    token_count bigint NOT NULL CHECK (token_count >= 0),
    sha256      text   NOT NULL CHECK (length(sha256) = 64),
    generation  text   NOT NULL REFERENCES generations(id),
    PRIMARY KEY (revision_id, chunk_index)
);

-- Append-only trail. `entity` names the table; `event` the kind of change.
CREATE TABLE history (
    seq           bigserial PRIMARY KEY,
    at            bigint NOT NULL,
    entity        text   NOT NULL CHECK (entity IN ('source', 'job', 'receipt', 'block', 'token',
                      'pause', 'generation')),
    entity_id     text   NOT NULL,
    event         text   NOT NULL,
    from_state    text,
    to_state      text,
    actor         text   NOT NULL,
    cause         text   NOT NULL,
    error_code    text,
    error_message text,
    stage         text
);
CREATE INDEX history_by_entity ON history (entity, entity_id, seq);

CREATE FUNCTION history_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'history is append-only' USING ERRCODE = 'restrict_violation';
END $$;
CREATE TRIGGER history_no_update BEFORE UPDATE OR DELETE ON history
    FOR EACH ROW EXECUTE FUNCTION history_refuse();
CREATE TRIGGER history_no_truncate BEFORE TRUNCATE ON history
    FOR EACH STATEMENT EXECUTE FUNCTION history_refuse();

-- One history row; `attributed` says whether the writer bumped change_seq (its own actor,
-- cause and time) or not (`unattributed`, at the database's clock).
CREATE FUNCTION history_add(attributed boolean, changed_at bigint, entity text, entity_id text,
    event text, from_state text, to_state text, actor text, cause text,
    error_code text DEFAULT NULL, error_message text DEFAULT NULL, stage text DEFAULT NULL)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO history (at, entity, entity_id, event, from_state, to_state, actor, cause,
                         error_code, error_message, stage)
    VALUES (CASE WHEN attributed THEN changed_at ELSE cairn_db_now() END, entity, entity_id,
            event, from_state, to_state,
            CASE WHEN attributed THEN actor ELSE 'unattributed' END,
            CASE WHEN attributed THEN cause ELSE 'unattributed_write' END,
            error_code, error_message, stage)
$$;

-- Inserts are recorded per statement (one INSERT ... SELECT over the transition table: an
-- acceptance wave of a thousand rows is one statement, not a thousand function calls);
-- updates per row, and only when the column that matters changed (the WHEN clause is checked
-- without calling the function, so heartbeats and other updates cost nothing here).
CREATE FUNCTION sources_created() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO history (at, entity, entity_id, event, from_state, to_state, actor, cause)
    SELECT changed_at, 'source', dataset || '/' || source_key, 'head_moved', NULL,
           head_revision_id::text, changed_by, change_cause
    FROM new_rows;
    RETURN NULL;
END $$;
CREATE TRIGGER sources_created AFTER INSERT ON sources REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION sources_created();

CREATE FUNCTION source_head_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM history_add(NEW.change_seq > OLD.change_seq, NEW.changed_at, 'source',
        NEW.dataset || '/' || NEW.source_key, 'head_moved', OLD.head_revision_id::text,
        NEW.head_revision_id::text, NEW.changed_by, NEW.change_cause);
    RETURN NULL;
END $$;
CREATE TRIGGER source_head_moved AFTER UPDATE ON sources FOR EACH ROW
    WHEN (NEW.head_revision_id IS DISTINCT FROM OLD.head_revision_id)
    EXECUTE FUNCTION source_head_moved();

-- A run leaving `running` for retry_wait, dead, cancelled or quarantined, or back to pending
-- after a lost lease, carries the job's error in its history row, and every run its stage.
CREATE FUNCTION jobs_created() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO history (at, entity, entity_id, event, from_state, to_state, actor, cause)
    SELECT changed_at, 'job', id::text, 'state', NULL, state, changed_by, change_cause
    FROM new_rows;
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_created AFTER INSERT ON jobs REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_created();

CREATE FUNCTION job_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    attributed boolean := NEW.change_seq > OLD.change_seq;
    ended_in_error boolean;
BEGIN
    IF NEW.state IS DISTINCT FROM OLD.state THEN
        ended_in_error := OLD.state = 'running'
            AND (NEW.state IN ('retry_wait', 'dead', 'cancelled', 'quarantined')
                 OR (NEW.state = 'pending' AND NEW.crashes > OLD.crashes));
        PERFORM history_add(attributed, NEW.changed_at, 'job', NEW.id::text, 'state', OLD.state,
            NEW.state, NEW.changed_by, NEW.change_cause,
            CASE WHEN ended_in_error THEN NEW.last_error_code END,
            CASE WHEN ended_in_error THEN NEW.last_error_message END,
            CASE WHEN OLD.state = 'running' THEN OLD.stage END);
    END IF;
    IF NEW.cancel_requested AND NOT OLD.cancel_requested THEN
        PERFORM history_add(attributed, NEW.changed_at, 'job', NEW.id::text, 'cancel_requested',
            NEW.state, NEW.state, NEW.changed_by, NEW.change_cause);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER job_changed AFTER UPDATE ON jobs FOR EACH ROW
    WHEN (NEW.state IS DISTINCT FROM OLD.state
          OR (NEW.cancel_requested AND NOT OLD.cancel_requested))
    EXECUTE FUNCTION job_changed();

CREATE FUNCTION receipts_created() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO history (at, entity, entity_id, event, from_state, to_state, actor, cause)
    SELECT changed_at, 'receipt', job_id || '/' || backend, 'state', NULL, state, changed_by,
           change_cause
    FROM new_rows;
    RETURN NULL;
END $$;
CREATE TRIGGER receipts_created AFTER INSERT ON projection_receipts
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION receipts_created();

CREATE FUNCTION receipt_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM history_add(NEW.change_seq > OLD.change_seq, NEW.changed_at, 'receipt',
        NEW.job_id || '/' || NEW.backend, 'state', OLD.state, NEW.state, NEW.changed_by,
        NEW.change_cause);
    RETURN NULL;
END $$;
CREATE TRIGGER receipt_changed AFTER UPDATE ON projection_receipts FOR EACH ROW
    WHEN (NEW.state IS DISTINCT FROM OLD.state)
    EXECUTE FUNCTION receipt_changed();

CREATE FUNCTION block_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM history_add(true, NEW.created_at, 'block', NEW.dataset || '/' || NEW.sha256,
            'blocked', NULL, 'blocked', NEW.actor, NEW.reason);
    ELSE
        PERFORM history_add(false, NULL, 'block', OLD.dataset || '/' || OLD.sha256, 'unblocked',
            'blocked', NULL, NULL, 'unblocked');
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER block_history AFTER INSERT OR DELETE ON content_blocks
    FOR EACH ROW EXECUTE FUNCTION block_history();

CREATE FUNCTION token_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM history_add(true, NEW.created_at, 'token', NEW.id::text, 'created', NULL,
            NEW.scopes::text, NEW.created_by, NEW.name);
    ELSIF NEW.revoked_at IS NOT NULL AND OLD.revoked_at IS NULL THEN
        INSERT INTO history (at, entity, entity_id, event, from_state, to_state, actor, cause)
        VALUES (NEW.revoked_at, 'token', NEW.id::text,
                CASE WHEN NEW.replaced_by IS NULL THEN 'revoked' ELSE 'rotated' END,
                'active', coalesce(NEW.replaced_by::text, 'revoked'),
                CASE WHEN NEW.revoked_by IS DISTINCT FROM OLD.revoked_by THEN NEW.revoked_by
                     ELSE 'unattributed' END,
                coalesce(CASE WHEN NEW.revoked_by IS DISTINCT FROM OLD.revoked_by
                              THEN NEW.revoke_reason END, 'unattributed_write'));
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER token_history AFTER INSERT OR UPDATE ON tokens
    FOR EACH ROW EXECUTE FUNCTION token_history();

CREATE FUNCTION pause_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM history_add(true, NEW.created_at, 'pause', NEW.dataset, 'paused', NULL, 'paused',
            NEW.actor, NEW.reason);
    ELSE
        PERFORM history_add(true, OLD.changed_at, 'pause', OLD.dataset, 'resumed', 'paused', NULL,
            OLD.changed_by, OLD.change_cause);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER pause_history AFTER INSERT OR DELETE ON claim_pauses
    FOR EACH ROW EXECUTE FUNCTION pause_history();

CREATE FUNCTION generation_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM history_add(true, NEW.created_at, 'generation', NEW.id, 'state', NULL,
        CASE WHEN NEW.active THEN 'active' ELSE 'inactive' END, NEW.created_by,
        'model ' || NEW.model || ' (' || NEW.dimension || ' dimensions), chunker ' || NEW.chunker
        || ', backends ' || NEW.backends::text);
    RETURN NULL;
END $$;
CREATE TRIGGER generation_history AFTER INSERT ON generations
    FOR EACH ROW EXECUTE FUNCTION generation_history();

-- Job activity per minute, counted from the history as it is written (so it can never
-- disagree with the trail): the dashboard reads 60 x 16 rows, not an hour of history. Each
-- minute is split into 16 shards picked by the writing backend's PID, so concurrent
-- transactions (claims, completions, acceptances in many processes) do not queue on one hot
-- row until each other's commit; readers sum the shards.
CREATE TABLE job_minutes (
    minute       bigint   NOT NULL, -- epoch minutes
    shard        smallint NOT NULL,
    claimed      bigint   NOT NULL DEFAULT 0,
    completed    bigint   NOT NULL DEFAULT 0,
    retried      bigint   NOT NULL DEFAULT 0,
    failed       bigint   NOT NULL DEFAULT 0,
    queued_delta bigint   NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, shard)
);
CREATE FUNCTION job_minutes_counted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_minutes AS m (minute, shard, claimed, completed, retried, failed, queued_delta)
    SELECT at / 60000000, pg_backend_pid() % 16,
           count(*) FILTER (WHERE to_state = 'running'),
           count(*) FILTER (WHERE to_state = 'completed'),
           count(*) FILTER (WHERE to_state = 'retry_wait'),
           count(*) FILTER (WHERE to_state IN ('dead', 'quarantined')),
           count(*) FILTER (WHERE to_state IN ('pending', 'retry_wait'))
             - count(*) FILTER (WHERE from_state IN ('pending', 'retry_wait'))
    FROM new_rows WHERE entity = 'job' AND event = 'state'
    GROUP BY at / 60000000
    ON CONFLICT (minute, shard) DO UPDATE SET
        claimed = m.claimed + excluded.claimed, completed = m.completed + excluded.completed,
        retried = m.retried + excluded.retried, failed = m.failed + excluded.failed,
        queued_delta = m.queued_delta + excluded.queued_delta;
    RETURN NULL;
END $$;
CREATE TRIGGER job_minutes_counted AFTER INSERT ON history REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION job_minutes_counted();

-- Lexical index: passages of current heads only, as byte ranges of the retained content with
-- their `tsvector` (the text is not stored twice), under a GIN index. Acceptance replaces a
-- source's passages in the transaction that moves its head.
CREATE TABLE passages (
    id            bigserial PRIMARY KEY,
    dataset       text     NOT NULL,
    source_key    text     NOT NULL,
    revision_id   uuid     NOT NULL REFERENCES revisions(id),
    passage_index bigint   NOT NULL CHECK (passage_index >= 0),
    byte_start    bigint   NOT NULL CHECK (byte_start >= 0),
    byte_end      bigint   NOT NULL CHECK (byte_end > byte_start),
    words         tsvector NOT NULL,
    UNIQUE (revision_id, passage_index)
);
CREATE INDEX passages_by_source ON passages (dataset, source_key);
CREATE INDEX passages_words ON passages USING gin (words);

-- Which revisions are vector-searchable, in one lookup: a revision is vector-searchable in a
-- generation when its vector and relational receipts are both verified for that generation.
-- Only the receipt trigger below writes it, in the receipt's own transaction.
CREATE TABLE searchable_revisions (
    revision_id uuid NOT NULL REFERENCES revisions(id),
    generation  text NOT NULL REFERENCES generations(id),
    PRIMARY KEY (revision_id, generation)
);

CREATE FUNCTION searchable_refresh(revision uuid) RETURNS void LANGUAGE sql AS $$
    DELETE FROM searchable_revisions WHERE revision_id = revision;
    INSERT INTO searchable_revisions (revision_id, generation)
    SELECT DISTINCT j.revision_id, v.generation
    FROM jobs j JOIN projection_receipts v ON v.job_id = j.id
    WHERE j.revision_id = revision
      AND v.backend = 'vector' AND v.state = 'verified' AND v.generation IS NOT NULL
      AND EXISTS (SELECT 1 FROM jobs jr JOIN projection_receipts r ON r.job_id = jr.id
                  WHERE jr.revision_id = revision AND r.backend = 'relational'
                    AND r.state = 'verified' AND r.generation = v.generation)
    ON CONFLICT DO NOTHING;
$$;

-- Only receipts entering or leaving `verified` can change the answer (the WHEN clauses keep
-- every other insert and update from calling the function at all).
CREATE FUNCTION receipt_searchable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM searchable_refresh(j.revision_id) FROM jobs j WHERE j.id = NEW.job_id;
    RETURN NULL;
END $$;
CREATE TRIGGER receipt_searchable_created AFTER INSERT ON projection_receipts FOR EACH ROW
    WHEN (NEW.backend IN ('vector', 'relational') AND NEW.state = 'verified')
    EXECUTE FUNCTION receipt_searchable();
CREATE TRIGGER receipt_searchable_changed AFTER UPDATE ON projection_receipts FOR EACH ROW
    WHEN (NEW.backend IN ('vector', 'relational')
          AND (NEW.state = 'verified' OR OLD.state = 'verified')
          AND (NEW.state IS DISTINCT FROM OLD.state
               OR NEW.generation IS DISTINCT FROM OLD.generation))
    EXECUTE FUNCTION receipt_searchable();

-- A claim in one call (one round trip, its own transaction): first the rescue of expired leases
-- (back to pending charged one crash, quarantined at the kind's crash limit, or cancelled if a
-- cancel was asked; rows another rescuer holds are skipped), then the claim of up to `p_limit`
-- due jobs in one statement: highest priority first; within a priority, datasets take turns
-- (the n-th oldest job of every dataset before the (n+1)-th of any); paused datasets skipped.
-- Datasets with due work are found by a recursive walk of `jobs_claim_by_dataset` (one index
-- probe per dataset); each contributes at most `p_limit` candidates, locked `SKIP LOCKED`, so
-- concurrent workers in any number of processes take disjoint jobs without waiting.
-- `p_now` is the caller's clock, or NULL for the database's.
CREATE FUNCTION cairn_claim(p_now bigint, p_owner text, p_limit bigint, p_policies jsonb)
RETURNS SETOF jobs LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint := coalesce(p_now, cairn_db_now());
BEGIN
        WITH expired AS (
        SELECT j.id, j.crashes + 1 >= policy.quarantine_after_crashes AS quarantine
        FROM jobs j JOIN jsonb_to_recordset(p_policies) AS policy(kind text, max_attempts bigint, lease_micros bigint, max_run_micros bigint, quarantine_after_crashes bigint) ON policy.kind = j.kind
        WHERE j.state = 'running' AND j.lease_expires_at <= v_now
        FOR UPDATE OF j SKIP LOCKED)
        UPDATE jobs j SET
        state = CASE WHEN j.cancel_requested THEN 'cancelled'
        WHEN e.quarantine THEN 'quarantined' ELSE 'pending' END,
        crashes = j.crashes + 1,
        last_error_code = 'lease_expired',
        last_error_message = 'lease of ' || j.lease_owner || ' expired at '
        || to_char(to_timestamp(j.lease_expires_at / 1000000.0) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
        || ' (last heartbeat ' || coalesce(to_char(to_timestamp(j.heartbeat_at / 1000000.0) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'), 'never')
        || ', stage ' || coalesce(j.stage, 'none') || ')',
        lease_id = NULL, lease_owner = NULL, lease_expires_at = NULL, heartbeat_at = NULL,
        deadline_at = NULL, stage = NULL, stage_at = NULL, run_at = v_now,
        run_at_rule = 'rescued after its lease expired',
        changed_by = 'cairn:rescuer (claim by ' || p_owner || ')',
        change_cause = CASE WHEN j.cancel_requested THEN 'lease_expired; cancel requested earlier'
        WHEN e.quarantine THEN 'lease_expired; quarantined after ' || (j.crashes + 1) || ' lost leases'
        ELSE 'lease_expired' END,
        changed_at = v_now, change_seq = j.change_seq + 1
        FROM expired e WHERE j.id = e.id;
    RETURN QUERY
        WITH RECURSIVE due(dataset) AS (
        (SELECT dataset FROM jobs WHERE state IN ('pending', 'retry_wait')
        ORDER BY dataset LIMIT 1)
        UNION ALL
        SELECT (SELECT j.dataset FROM jobs j WHERE j.state IN ('pending', 'retry_wait')
        AND j.dataset > due.dataset ORDER BY j.dataset LIMIT 1)
        FROM due WHERE due.dataset IS NOT NULL),
        candidates AS (
        SELECT c.id, c.dataset, c.priority, c.run_at FROM due
        CROSS JOIN LATERAL (
        SELECT j.id, j.dataset, j.priority, j.run_at FROM jobs j
        WHERE j.state IN ('pending', 'retry_wait') AND j.dataset = due.dataset
        AND j.run_at <= v_now
        ORDER BY j.priority DESC, j.run_at, j.id LIMIT p_limit
        FOR UPDATE OF j SKIP LOCKED) c
        WHERE due.dataset IS NOT NULL
        AND NOT EXISTS (SELECT 1 FROM claim_pauses pause
        WHERE pause.dataset = '*' OR pause.dataset = due.dataset)),
        chosen AS (
        SELECT id FROM (
        SELECT id, priority, run_at,
        row_number() OVER (PARTITION BY priority, dataset ORDER BY run_at, id) AS turn
        FROM candidates) turns
        ORDER BY priority DESC, turn, run_at, id LIMIT p_limit),
        claimed AS (
        UPDATE jobs SET state = 'running',
        lease_id = replace(gen_random_uuid()::text, '-', ''), lease_owner = p_owner,
        lease_expires_at = v_now + least(policy.lease_micros, policy.max_run_micros),
        heartbeat_at = v_now, deadline_at = v_now + policy.max_run_micros,
        started_at = v_now, first_started_at = coalesce(jobs.first_started_at, v_now),
        stage = 'claimed', stage_at = v_now, changed_by = p_owner,
        change_cause = 'claimed (failures so far ' || jobs.attempt || ' of '
        || jobs.max_attempts || ', crashes ' || jobs.crashes || ')',
        changed_at = v_now, change_seq = jobs.change_seq + 1
        FROM chosen, jsonb_to_recordset(p_policies) AS policy(kind text, max_attempts bigint, lease_micros bigint, max_run_micros bigint, quarantine_after_crashes bigint)
        WHERE jobs.id = chosen.id AND policy.kind = jobs.kind
        RETURNING jobs.*)
        SELECT * FROM claimed;
END $$;
