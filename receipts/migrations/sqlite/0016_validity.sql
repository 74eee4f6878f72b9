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
