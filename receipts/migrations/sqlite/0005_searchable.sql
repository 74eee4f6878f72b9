-- cairn ledger, schema 5: which revisions are vector-searchable, in one lookup.
--
-- A revision is vector-searchable in a generation when its vector and relational receipts are
-- both verified for that generation (through any of its jobs). Search checks this for every
-- hit; asked of the receipts themselves it is two index walks per backend (jobs by revision,
-- then the receipt), about a third of the cost of binding a page of hits. This table holds
-- the answer, one row per (revision, generation). Only `searchable_refresh` writes it, and the
-- receipt triggers call it whenever a vector or relational receipt enters or leaves `verified`
-- (or changes generation while verified), in the same transaction: it cannot disagree with the
-- receipts.
CREATE TABLE searchable_revisions (
    revision_id TEXT NOT NULL REFERENCES revisions(id),
    generation  TEXT NOT NULL REFERENCES generations(id),
    PRIMARY KEY (revision_id, generation)
) STRICT, WITHOUT ROWID;

-- Inserting a revision id here recomputes that revision's rows from its receipts.
CREATE VIEW searchable_refresh AS SELECT NULL AS revision_id WHERE 0;
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

-- Only receipts entering or leaving `verified` can change the answer, so acceptance (which
-- inserts `pending` receipts and supersedes unfinished ones) never runs the refresh.
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

-- Receipts written before this schema.
INSERT INTO searchable_refresh (revision_id)
SELECT DISTINCT j.revision_id FROM jobs j JOIN projection_receipts v ON v.job_id = j.id
WHERE v.backend = 'vector' AND v.state = 'verified';
