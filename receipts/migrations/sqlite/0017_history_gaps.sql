-- Validity time: the revisions that held at some time but that temporal search cannot return
-- from an index, so that an answer at (T, R) can say that its history is partial instead of
-- silently missing them (`Reader::history_gaps`). A `vector` gap names the generation that
-- holds no chunk rows of the revision; a `lexical` gap (generation '') a revision with no
-- passages, current or past. A gap row stays when the revision is projected later: readers
-- check the chunk rows again.
CREATE TABLE history_gaps (
    revision_id TEXT    NOT NULL,
    index_kind  TEXT    NOT NULL CHECK (index_kind IN ('vector', 'lexical')),
    generation  TEXT    NOT NULL,
    dataset     TEXT    NOT NULL,
    source_key  TEXT    NOT NULL,
    reason      TEXT    NOT NULL,
    PRIMARY KEY (revision_id, index_kind, generation)
) STRICT, WITHOUT ROWID;
CREATE INDEX history_gaps_by_dataset ON history_gaps(dataset, index_kind, generation);

-- A project job that ends superseded before it wrote its generation's chunk rows leaves its
-- revision out of that generation's vectors: a revision superseded before projection, or one
-- that holds only in the past (its job is superseded as it is queued).
CREATE TRIGGER history_gap_when_superseded AFTER UPDATE OF state ON jobs
WHEN NEW.state = 'superseded' AND OLD.state <> 'superseded' AND NEW.kind = 'project'
 AND NEW.generation IS NOT NULL
 AND NOT EXISTS (SELECT 1 FROM chunks WHERE revision_id = NEW.revision_id
                 AND generation = NEW.generation)
BEGIN
    INSERT OR IGNORE INTO history_gaps (revision_id, index_kind, generation, dataset,
        source_key, reason)
    VALUES (NEW.revision_id, 'vector', NEW.generation, NEW.dataset, NEW.source_key,
            'superseded before projection');
END;
CREATE TRIGGER history_gap_when_queued_superseded AFTER INSERT ON jobs
WHEN NEW.state = 'superseded' AND NEW.kind = 'project' AND NEW.generation IS NOT NULL
 AND NOT EXISTS (SELECT 1 FROM chunks WHERE revision_id = NEW.revision_id
                 AND generation = NEW.generation)
BEGIN
    INSERT OR IGNORE INTO history_gaps (revision_id, index_kind, generation, dataset,
        source_key, reason)
    VALUES (NEW.revision_id, 'vector', NEW.generation, NEW.dataset, NEW.source_key,
            'holds only in the past: not projected');
END;

-- What an older ledger left: content revisions that are no head and have no chunk rows in a
-- live generation, and (superseded before schema 16 kept past passages) none in the archive.
INSERT OR IGNORE INTO history_gaps (revision_id, index_kind, generation, dataset, source_key,
    reason)
SELECT r.id, 'vector', g.id, r.dataset, r.source_key, 'not projected before schema 17'
FROM revisions AS r CROSS JOIN generations AS g
WHERE g.state IN ('active', 'building', 'standby') AND r.tombstone = 0
  AND NOT EXISTS (SELECT 1 FROM sources AS s WHERE s.head_revision_id = r.id)
  AND NOT EXISTS (SELECT 1 FROM chunks AS c WHERE c.revision_id = r.id AND c.generation = g.id);
INSERT OR IGNORE INTO history_gaps (revision_id, index_kind, generation, dataset, source_key,
    reason)
SELECT r.id, 'lexical', '', r.dataset, r.source_key, 'superseded before schema 16'
FROM revisions AS r
WHERE r.tombstone = 0 AND r.byte_length > 0
  AND NOT EXISTS (SELECT 1 FROM sources AS s WHERE s.head_revision_id = r.id)
  AND NOT EXISTS (SELECT 1 FROM past_passages AS p WHERE p.revision_id = r.id);

-- A generation is built from the heads of its time: every other revision is a gap in it.
CREATE TRIGGER history_gaps_of_a_new_generation AFTER INSERT ON generations
BEGIN
    INSERT OR IGNORE INTO history_gaps (revision_id, index_kind, generation, dataset,
        source_key, reason)
    SELECT r.id, 'vector', NEW.id, r.dataset, r.source_key,
           'superseded before the generation was built'
    FROM revisions AS r
    WHERE r.tombstone = 0
      AND NOT EXISTS (SELECT 1 FROM sources AS s WHERE s.head_revision_id = r.id);
END;
