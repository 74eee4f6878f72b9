-- cairn ledger (PostgreSQL), schema 16: validity time (`receipts::validity`). The same tables,
-- rules and backfill as the SQLite ledger's schema 16 (see there):
-- - `assertions`, append-only, one per acceptance that writes;
-- - `validity`, the derived rectangles, whose only change is closing the record period once;
-- - neither deleted from while its revision exists (an erasure deletes the revision first);
-- - each assertion recorded in `history` (entity `source`, event `asserted`);
-- - sources accepted before get one assertion per head move, from that instant on.
CREATE TABLE assertions (
    id          uuid    PRIMARY KEY,
    dataset     text    NOT NULL,
    source_key  text    NOT NULL,
    seq         bigint  NOT NULL CHECK (seq >= 1),
    revision_id uuid    NOT NULL,
    valid_from  bigint  NOT NULL CHECK (valid_from >= 0),
    valid_to    bigint  NOT NULL CHECK (valid_to > valid_from AND valid_to <= 9007199254740991),
    recorded_at bigint  NOT NULL,
    actor       text    NOT NULL,
    cause       text    NOT NULL,
    UNIQUE (dataset, source_key, seq),
    UNIQUE (dataset, source_key, recorded_at)
);
CREATE INDEX assertions_by_revision ON assertions (revision_id);

CREATE TABLE validity (
    id            uuid    PRIMARY KEY,
    dataset       text    NOT NULL,
    source_key    text    NOT NULL,
    revision_id   uuid    NOT NULL,
    assertion_id  uuid    NOT NULL,
    valid_from    bigint  NOT NULL,
    valid_to      bigint  NOT NULL CHECK (valid_to > valid_from AND valid_to <= 9007199254740991),
    recorded_from bigint  NOT NULL,
    recorded_to   bigint  NOT NULL DEFAULT 9007199254740991
                  CHECK (recorded_to > recorded_from AND recorded_to <= 9007199254740991)
);
CREATE INDEX validity_by_source ON validity (dataset, source_key, recorded_to, valid_from);
CREATE INDEX validity_by_revision ON validity (revision_id);

CREATE FUNCTION validity_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF EXISTS (SELECT 1 FROM revisions WHERE id = OLD.revision_id) THEN
            RAISE EXCEPTION '% rows go only with their erased revision', TG_TABLE_NAME
                USING ERRCODE = 'restrict_violation';
        END IF;
        RETURN OLD;
    END IF;
    IF TG_TABLE_NAME = 'assertions' THEN
        RAISE EXCEPTION 'assertions are append-only' USING ERRCODE = 'restrict_violation';
    END IF;
    IF OLD.recorded_to <> 9007199254740991
       OR (NEW.id, NEW.dataset, NEW.source_key, NEW.revision_id, NEW.assertion_id,
           NEW.valid_from, NEW.valid_to, NEW.recorded_from)
          IS DISTINCT FROM
          (OLD.id, OLD.dataset, OLD.source_key, OLD.revision_id, OLD.assertion_id,
           OLD.valid_from, OLD.valid_to, OLD.recorded_from) THEN
        RAISE EXCEPTION 'a validity rectangle only closes its record period, once'
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER assertions_guard BEFORE UPDATE OR DELETE ON assertions
    FOR EACH ROW EXECUTE FUNCTION validity_guard();
CREATE TRIGGER validity_guard BEFORE UPDATE OR DELETE ON validity
    FOR EACH ROW EXECUTE FUNCTION validity_guard();

CREATE FUNCTION assertions_recorded() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO history (at, entity, entity_id, event, from_state, to_state, actor, cause)
    SELECT recorded_at, 'source', dataset || '/' || source_key, 'asserted', NULL,
           revision_id::text || ' valid [' || valid_from || ', '
               || CASE WHEN valid_to = 9007199254740991 THEN 'open' ELSE valid_to::text END
               || ')',
           actor, cause
    FROM new_rows;
    RETURN NULL;
END $$;
CREATE TRIGGER assertions_recorded AFTER INSERT ON assertions REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION assertions_recorded();

CREATE TEMP TABLE validity_backfill ON COMMIT DROP AS
WITH moves AS (
    SELECT s.dataset, s.source_key, r.id AS revision_id, h.at, h.seq, h.actor, h.cause,
           lead(h.at) OVER (PARTITION BY s.dataset, s.source_key ORDER BY h.seq) AS next_at
    FROM history h
    JOIN sources s ON h.entity_id = s.dataset || '/' || s.source_key
    JOIN revisions r ON r.id::text = h.to_state
    WHERE h.entity = 'source' AND h.event = 'head_moved'
),
kept AS (
    SELECT * FROM moves WHERE next_at IS NULL OR next_at > at
)
SELECT gen_random_uuid() AS id, dataset, source_key, revision_id, at, actor, cause,
       row_number() OVER (PARTITION BY dataset, source_key ORDER BY seq) AS n,
       lead(at) OVER (PARTITION BY dataset, source_key ORDER BY seq) AS next_at
FROM kept;

INSERT INTO assertions (id, dataset, source_key, seq, revision_id, valid_from, valid_to,
    recorded_at, actor, cause)
SELECT id, dataset, source_key, n, revision_id, at, 9007199254740991, at, actor, cause
FROM validity_backfill;
INSERT INTO validity (id, dataset, source_key, revision_id, assertion_id, valid_from,
    valid_to, recorded_from, recorded_to)
SELECT gen_random_uuid(), dataset, source_key, revision_id, id, at, 9007199254740991, at,
       coalesce(next_at, 9007199254740991)
FROM validity_backfill;
INSERT INTO validity (id, dataset, source_key, revision_id, assertion_id, valid_from,
    valid_to, recorded_from, recorded_to)
SELECT gen_random_uuid(), dataset, source_key, revision_id, id, at, next_at, next_at,
       9007199254740991
FROM validity_backfill WHERE next_at IS NOT NULL;

-- Past passages: the lexical index of revisions that are no longer head, as on SQLite (see
-- its schema 16): kept from the passages a head move deletes, once per revision, unless the
-- revision is gone.
CREATE TABLE past_passages (
    id            bigserial PRIMARY KEY,
    dataset       text     NOT NULL,
    source_key    text     NOT NULL,
    revision_id   uuid     NOT NULL,
    passage_index bigint   NOT NULL CHECK (passage_index >= 0),
    byte_start    bigint   NOT NULL CHECK (byte_start >= 0),
    byte_end      bigint   NOT NULL CHECK (byte_end > byte_start),
    words         tsvector NOT NULL,
    text          text,
    section       text,
    page          bigint,
    UNIQUE (revision_id, passage_index)
);
CREATE INDEX past_passages_by_source ON past_passages (dataset, source_key);
CREATE INDEX past_passages_words ON past_passages USING gin (words);

CREATE FUNCTION passages_archived() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO past_passages (dataset, source_key, revision_id, passage_index, byte_start,
        byte_end, words, text, section, page)
    SELECT o.dataset, o.source_key, o.revision_id, o.passage_index, o.byte_start, o.byte_end,
           o.words, o.text, o.section, o.page
    FROM old_rows o
    WHERE EXISTS (SELECT 1 FROM revisions r WHERE r.id = o.revision_id)
    ON CONFLICT (revision_id, passage_index) DO NOTHING;
    RETURN NULL;
END $$;
CREATE TRIGGER passages_archived AFTER DELETE ON passages REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION passages_archived();
