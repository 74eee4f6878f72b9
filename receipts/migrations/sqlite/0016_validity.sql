-- cairn ledger, schema 16: validity time (`receipts::validity`).
--
-- - `assertions`: append-only, one row per acceptance that writes (and per head asserted
--   further back): revision X held over [valid_from, valid_to), recorded at `recorded_at`,
--   in the source's own order `seq`. Record time increases strictly per source.
-- - `validity`: the derived rectangles, a revision holding over [valid_from, valid_to) while
--   cairn believed it, [recorded_from, recorded_to). Acceptance closes the believed ones an
--   assertion overrides (sets `recorded_to`, the only change a rectangle allows) and adds
--   the parts left of them and its own, in the same transaction.
-- - An open end is 2^53 - 1 on both axes.
-- - Neither table can be updated otherwise, nor deleted from while the revision exists: only
--   an erasure (which deletes the revision first) removes them.
-- - Each assertion is recorded in `history` (entity `source`, event `asserted`) by a trigger.
-- - Sources accepted before this schema get their assertions from their head moves in
--   `history`: each move to a revision that still exists asserted it from that instant on.
CREATE TABLE assertions (
    id          TEXT    PRIMARY KEY,
    dataset     TEXT    NOT NULL,
    source_key  TEXT    NOT NULL,
    seq         INTEGER NOT NULL CHECK (seq >= 1),
    revision_id TEXT    NOT NULL,
    valid_from  INTEGER NOT NULL CHECK (valid_from >= 0),
    valid_to    INTEGER NOT NULL CHECK (valid_to > valid_from AND valid_to <= 9007199254740991),
    recorded_at INTEGER NOT NULL,
    actor       TEXT    NOT NULL,
    cause       TEXT    NOT NULL,
    UNIQUE (dataset, source_key, seq),
    UNIQUE (dataset, source_key, recorded_at)
) STRICT, WITHOUT ROWID;
CREATE INDEX assertions_by_revision ON assertions(revision_id);

CREATE TABLE validity (
    id            TEXT    PRIMARY KEY,
    dataset       TEXT    NOT NULL,
    source_key    TEXT    NOT NULL,
    revision_id   TEXT    NOT NULL,
    assertion_id  TEXT    NOT NULL,
    valid_from    INTEGER NOT NULL,
    valid_to      INTEGER NOT NULL CHECK (valid_to > valid_from AND valid_to <= 9007199254740991),
    recorded_from INTEGER NOT NULL,
    recorded_to   INTEGER NOT NULL DEFAULT 9007199254740991
                  CHECK (recorded_to > recorded_from AND recorded_to <= 9007199254740991)
) STRICT, WITHOUT ROWID;
CREATE INDEX validity_by_source ON validity(dataset, source_key, recorded_to, valid_from);
CREATE INDEX validity_by_revision ON validity(revision_id);

CREATE TRIGGER assertions_append_only BEFORE UPDATE ON assertions
BEGIN SELECT RAISE(ABORT, 'assertions are append-only'); END;
CREATE TRIGGER assertions_kept BEFORE DELETE ON assertions
WHEN EXISTS (SELECT 1 FROM revisions WHERE id = OLD.revision_id)
BEGIN SELECT RAISE(ABORT, 'an assertion goes only with its erased revision'); END;
CREATE TRIGGER validity_closes_only BEFORE UPDATE ON validity
WHEN OLD.recorded_to <> 9007199254740991
  OR NEW.id IS NOT OLD.id OR NEW.dataset IS NOT OLD.dataset
  OR NEW.source_key IS NOT OLD.source_key OR NEW.revision_id IS NOT OLD.revision_id
  OR NEW.assertion_id IS NOT OLD.assertion_id OR NEW.valid_from IS NOT OLD.valid_from
  OR NEW.valid_to IS NOT OLD.valid_to OR NEW.recorded_from IS NOT OLD.recorded_from
BEGIN SELECT RAISE(ABORT, 'a validity rectangle only closes its record period, once'); END;
CREATE TRIGGER validity_kept BEFORE DELETE ON validity
WHEN EXISTS (SELECT 1 FROM revisions WHERE id = OLD.revision_id)
BEGIN SELECT RAISE(ABORT, 'a validity rectangle goes only with its erased revision'); END;

CREATE TRIGGER assertion_recorded AFTER INSERT ON assertions
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.recorded_at, 'source', NEW.dataset || '/' || NEW.source_key, 'asserted', NULL,
            NEW.revision_id || ' valid [' || NEW.valid_from || ', '
                || CASE WHEN NEW.valid_to = 9007199254740991 THEN 'open' ELSE NEW.valid_to END
                || ')',
            NEW.actor, NEW.cause);
END;

-- The sources accepted before: one assertion per head move to a revision that still exists
-- (of moves in the same microsecond, the last), from that instant on.
CREATE TEMP TABLE validity_backfill AS
WITH moves AS (
    SELECT source.dataset, source.source_key, move.to_state AS revision_id, move.at,
           move.seq, move.actor, move.cause,
           lead(move.at) OVER (PARTITION BY source.dataset, source.source_key
                               ORDER BY move.seq) AS next_at
    FROM history AS move
    JOIN sources AS source ON move.entity_id = source.dataset || '/' || source.source_key
    JOIN revisions AS revision ON revision.id = move.to_state
    WHERE move.entity = 'source' AND move.event = 'head_moved'
),
kept AS (
    SELECT * FROM moves WHERE next_at IS NULL OR next_at > at
)
SELECT lower(hex(randomblob(4))) || '-' || lower(hex(randomblob(2))) || '-4'
           || substr(lower(hex(randomblob(2))), 2) || '-a'
           || substr(lower(hex(randomblob(2))), 2) || '-' || lower(hex(randomblob(6))) AS id,
       dataset, source_key, revision_id, at, actor, cause,
       row_number() OVER (PARTITION BY dataset, source_key ORDER BY seq) AS n,
       lead(at) OVER (PARTITION BY dataset, source_key ORDER BY seq) AS next_at
FROM kept;

INSERT INTO assertions (id, dataset, source_key, seq, revision_id, valid_from, valid_to,
    recorded_at, actor, cause)
SELECT id, dataset, source_key, n, revision_id, at, 9007199254740991, at, actor, cause
FROM validity_backfill;

-- Each assertion believed [at, open) until the next one, then [at, next) from the next on.
INSERT INTO validity (id, dataset, source_key, revision_id, assertion_id, valid_from,
    valid_to, recorded_from, recorded_to)
SELECT lower(hex(randomblob(4))) || '-' || lower(hex(randomblob(2))) || '-4'
           || substr(lower(hex(randomblob(2))), 2) || '-a'
           || substr(lower(hex(randomblob(2))), 2) || '-' || lower(hex(randomblob(6))),
       dataset, source_key, revision_id, id, at, 9007199254740991, at,
       coalesce(next_at, 9007199254740991)
FROM validity_backfill;
INSERT INTO validity (id, dataset, source_key, revision_id, assertion_id, valid_from,
    valid_to, recorded_from, recorded_to)
SELECT lower(hex(randomblob(4))) || '-' || lower(hex(randomblob(2))) || '-4'
           || substr(lower(hex(randomblob(2))), 2) || '-a'
           || substr(lower(hex(randomblob(2))), 2) || '-' || lower(hex(randomblob(6))),
       dataset, source_key, revision_id, id, at, next_at, next_at, 9007199254740991
FROM validity_backfill WHERE next_at IS NOT NULL;
DROP TABLE validity_backfill;

-- Past passages: the lexical index of revisions that are no longer head, for searches at a
-- past valid or record time. The index of current heads (`passages`) stays as it is; when a
-- head's passages leave it (its source moved on), this trigger keeps a copy here, once per
-- revision, unless the revision itself is gone (an erasure deletes it after its passages, and
-- then removes these copies too). Revisions superseded before this schema have none: an
-- answer that needs them says its history is partial.
CREATE TABLE past_passages (
    id            INTEGER PRIMARY KEY,
    dataset       TEXT    NOT NULL,
    source_key    TEXT    NOT NULL,
    revision_id   TEXT    NOT NULL,
    passage_index INTEGER NOT NULL CHECK (passage_index >= 0),
    byte_start    INTEGER NOT NULL CHECK (byte_start >= 0),
    byte_end      INTEGER NOT NULL CHECK (byte_end > byte_start),
    text          TEXT,
    section       TEXT,
    page          INTEGER,
    UNIQUE (revision_id, passage_index)
) STRICT;
CREATE INDEX past_passages_by_source ON past_passages(dataset, source_key);
CREATE VIRTUAL TABLE past_passages_fts USING fts5(
    text, content = '', contentless_delete = 1, tokenize = 'porter unicode61'
);
CREATE TRIGGER past_passages_ad AFTER DELETE ON past_passages BEGIN
    DELETE FROM past_passages_fts WHERE rowid = OLD.id;
END;
CREATE TRIGGER passages_archived AFTER DELETE ON passages
WHEN NOT EXISTS (SELECT 1 FROM past_passages
                 WHERE revision_id = OLD.revision_id AND passage_index = OLD.passage_index)
BEGIN
    INSERT INTO past_passages (dataset, source_key, revision_id, passage_index, byte_start,
        byte_end, text, section, page)
    SELECT OLD.dataset, OLD.source_key, OLD.revision_id, OLD.passage_index, OLD.byte_start,
           OLD.byte_end, OLD.text, OLD.section, OLD.page
    FROM revisions AS revision WHERE revision.id = OLD.revision_id;
    INSERT INTO past_passages_fts (rowid, text)
    SELECT archived.id,
           coalesce(archived.text, CAST(substr(content.bytes, archived.byte_start + 1,
                                               archived.byte_end - archived.byte_start) AS TEXT))
    FROM past_passages AS archived
    JOIN revisions AS revision ON revision.id = archived.revision_id
    JOIN contents AS content ON content.sha256 = revision.content_sha256
    WHERE archived.revision_id = OLD.revision_id AND archived.passage_index = OLD.passage_index;
END;
