-- Validity time: the revisions that held at some time but that temporal search cannot return
-- from an index, as on SQLite (see its 0017 for the model).
CREATE TABLE history_gaps (
    revision_id uuid NOT NULL,
    index_kind  text NOT NULL CHECK (index_kind IN ('vector', 'lexical')),
    generation  text NOT NULL,
    dataset     text NOT NULL,
    source_key  text NOT NULL,
    reason      text NOT NULL,
    PRIMARY KEY (revision_id, index_kind, generation)
);
CREATE INDEX history_gaps_by_dataset ON history_gaps (dataset, index_kind, generation);

-- A project job that ends superseded before it wrote its generation's chunk rows (or is
-- queued superseded: a revision that holds only in the past) leaves its revision out of that
-- generation's vectors. Row triggers with a WHEN clause: the hot paths that update jobs
-- (claims, heartbeats) never call the function.
CREATE FUNCTION history_gap_when_superseded() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO history_gaps (revision_id, index_kind, generation, dataset, source_key, reason)
    SELECT NEW.revision_id, 'vector', NEW.generation, NEW.dataset, NEW.source_key,
           CASE WHEN TG_OP = 'INSERT' THEN 'holds only in the past: not projected'
                ELSE 'superseded before projection' END
    WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.revision_id = NEW.revision_id
                      AND c.generation = NEW.generation)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
CREATE TRIGGER history_gap_when_superseded AFTER UPDATE OF state ON jobs FOR EACH ROW
    WHEN (NEW.state = 'superseded' AND OLD.state <> 'superseded' AND NEW.kind = 'project'
          AND NEW.generation IS NOT NULL)
    EXECUTE FUNCTION history_gap_when_superseded();
CREATE TRIGGER history_gap_when_queued_superseded AFTER INSERT ON jobs FOR EACH ROW
    WHEN (NEW.state = 'superseded' AND NEW.kind = 'project' AND NEW.generation IS NOT NULL)
    EXECUTE FUNCTION history_gap_when_superseded();

-- What an older ledger left: content revisions that are no head and have no chunk rows in a
-- live generation, and (superseded before schema 16 kept past passages) none in the archive.
INSERT INTO history_gaps (revision_id, index_kind, generation, dataset, source_key, reason)
SELECT r.id, 'vector', g.id, r.dataset, r.source_key, 'not projected before schema 17'
FROM revisions r CROSS JOIN generations g
WHERE g.state IN ('active', 'building', 'standby') AND NOT r.tombstone
  AND NOT EXISTS (SELECT 1 FROM sources s WHERE s.head_revision_id = r.id)
  AND NOT EXISTS (SELECT 1 FROM chunks c WHERE c.revision_id = r.id AND c.generation = g.id)
ON CONFLICT DO NOTHING;
INSERT INTO history_gaps (revision_id, index_kind, generation, dataset, source_key, reason)
SELECT r.id, 'lexical', '', r.dataset, r.source_key, 'superseded before schema 16'
FROM revisions r
WHERE NOT r.tombstone AND r.byte_length > 0
  AND NOT EXISTS (SELECT 1 FROM sources s WHERE s.head_revision_id = r.id)
  AND NOT EXISTS (SELECT 1 FROM past_passages p WHERE p.revision_id = r.id)
ON CONFLICT DO NOTHING;

-- A generation is built from the heads of its time: every other revision is a gap in it.
CREATE FUNCTION history_gaps_of_a_new_generation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO history_gaps (revision_id, index_kind, generation, dataset, source_key, reason)
    SELECT r.id, 'vector', NEW.id, r.dataset, r.source_key,
           'superseded before the generation was built'
    FROM revisions r
    WHERE NOT r.tombstone
      AND NOT EXISTS (SELECT 1 FROM sources s WHERE s.head_revision_id = r.id)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
CREATE TRIGGER history_gaps_of_a_new_generation AFTER INSERT ON generations FOR EACH ROW
    EXECUTE FUNCTION history_gaps_of_a_new_generation();
