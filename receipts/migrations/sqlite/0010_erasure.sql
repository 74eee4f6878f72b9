-- cairn ledger, schema 10: erasure.
--
-- An erased source keeps one revision, the erasure's tombstone; every earlier revision is
-- deleted with its jobs, receipts, chunk rows, passages and (unless another source holds the
-- same bytes) its content. `erasures` records what was erased, and its trigger writes the
-- history row: who, why, when and the content hashes, never content. Receipts gain the state
-- `erased` (SQLite cannot alter a CHECK constraint, so the column is replaced, with the
-- triggers that name it). The lexical index deletes for good (FTS5 `secure-delete`), so an
-- erased word does not linger in its segments.
DROP TRIGGER receipt_created;
DROP TRIGGER receipt_state_changed;
DROP TRIGGER receipt_searchable_created;
DROP TRIGGER receipt_searchable_changed;
DROP TRIGGER searchable_refreshed;
ALTER TABLE projection_receipts ADD COLUMN state_checked TEXT NOT NULL DEFAULT 'pending'
    CHECK (state_checked IN ('pending', 'running', 'written', 'verified', 'excluded', 'failed',
                             'superseded', 'erased'));
UPDATE projection_receipts SET state_checked = state;
ALTER TABLE projection_receipts DROP COLUMN state;
ALTER TABLE projection_receipts RENAME COLUMN state_checked TO state;

CREATE TRIGGER receipt_created AFTER INSERT ON projection_receipts
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.changed_at, 'receipt', NEW.job_id || '/' || NEW.backend, 'state', NULL, NEW.state,
            NEW.changed_by, NEW.change_cause);
END;
CREATE TRIGGER receipt_state_changed AFTER UPDATE OF state ON projection_receipts
WHEN NEW.state IS NOT OLD.state
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    SELECT CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_at ELSE now_micros END,
           'receipt', NEW.job_id || '/' || NEW.backend, 'state', OLD.state, NEW.state,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_by ELSE 'unattributed' END,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.change_cause ELSE 'unattributed_write' END
    FROM db_clock;
END;
CREATE TRIGGER searchable_refreshed INSTEAD OF INSERT ON searchable_refresh
BEGIN
    DELETE FROM searchable_revisions WHERE revision_id = NEW.revision_id;
    INSERT OR IGNORE INTO searchable_revisions (revision_id, generation)
    SELECT j.revision_id, v.generation
    FROM jobs j JOIN projection_receipts v ON v.job_id = j.id
    WHERE j.revision_id = NEW.revision_id
      AND v.backend = 'vector' AND v.state = 'verified' AND v.generation IS NOT NULL
      AND EXISTS (SELECT 1 FROM jobs jr JOIN projection_receipts r ON r.job_id = jr.id
                  WHERE jr.revision_id = NEW.revision_id AND r.backend = 'relational'
                    AND r.state = 'verified' AND r.generation = v.generation);
END;
CREATE TRIGGER receipt_searchable_created AFTER INSERT ON projection_receipts
WHEN NEW.backend IN ('vector', 'relational') AND NEW.state = 'verified'
BEGIN
    INSERT INTO searchable_refresh (revision_id)
    SELECT revision_id FROM jobs WHERE id = NEW.job_id;
END;
CREATE TRIGGER receipt_searchable_changed AFTER UPDATE OF state, generation ON projection_receipts
WHEN NEW.backend IN ('vector', 'relational')
  AND (NEW.state = 'verified' OR OLD.state = 'verified')
  AND (NEW.state IS NOT OLD.state OR NEW.generation IS NOT OLD.generation)
BEGIN
    INSERT INTO searchable_refresh (revision_id)
    SELECT revision_id FROM jobs WHERE id = NEW.job_id;
END;

CREATE TABLE erasures (
    revision_id        TEXT    PRIMARY KEY REFERENCES revisions(id),
    dataset            TEXT    NOT NULL,
    source_key         TEXT    NOT NULL,
    revisions_erased   INTEGER NOT NULL CHECK (revisions_erased >= 0),
    content_sha256     TEXT    NOT NULL CHECK (json_valid(content_sha256)),
    contents_deleted   INTEGER NOT NULL CHECK (contents_deleted >= 0),
    chunk_rows_deleted INTEGER NOT NULL CHECK (chunk_rows_deleted >= 0),
    actor              TEXT    NOT NULL,
    reason             TEXT    NOT NULL,
    erased_at          INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
CREATE INDEX erasures_by_source ON erasures(dataset, source_key);

CREATE TRIGGER erasure_recorded AFTER INSERT ON erasures
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.erased_at, 'source', NEW.dataset || '/' || NEW.source_key, 'erased', NULL,
            NEW.revision_id, NEW.actor,
            NEW.reason || ' (' || NEW.revisions_erased || ' revision(s) erased; content sha256 '
            || NEW.content_sha256 || ')');
END;

INSERT INTO passages_fts (passages_fts, rank) VALUES ('secure-delete', 1);
