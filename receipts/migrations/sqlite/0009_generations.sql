-- cairn ledger, schema 9: generations built side by side.
--
-- A generation now has a life (`building`, `active`, `standby`, `retiring`, `retired`) instead
-- of an active flag; exactly one is active once any exists. Its state changes are recorded in
-- history by trigger, like every other state column. Jobs name the generation they write
-- (`project` and `tombstone` jobs; NULL for graph jobs and for jobs queued before any
-- generation existed), and chunk rows are kept per generation, so two generations of the same
-- revision sit side by side.
DROP TRIGGER generation_created;
DROP INDEX generations_one_active;
ALTER TABLE generations ADD COLUMN state TEXT NOT NULL DEFAULT 'standby'
    CHECK (state IN ('building', 'active', 'standby', 'retiring', 'retired'));
UPDATE generations SET state = CASE WHEN active = 1 THEN 'active' ELSE 'standby' END;
ALTER TABLE generations DROP COLUMN active;
ALTER TABLE generations ADD COLUMN changed_by TEXT NOT NULL DEFAULT '';
ALTER TABLE generations ADD COLUMN change_cause TEXT NOT NULL DEFAULT '';
ALTER TABLE generations ADD COLUMN changed_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE generations ADD COLUMN change_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE generations ADD COLUMN retired_evidence TEXT
    CHECK (retired_evidence IS NULL OR json_valid(retired_evidence));
UPDATE generations SET changed_by = created_by, change_cause = 'created', changed_at = created_at;
CREATE UNIQUE INDEX generations_one_active ON generations (state) WHERE state = 'active';

CREATE TRIGGER generation_created AFTER INSERT ON generations
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.created_at, 'generation', NEW.id, 'state', NULL, NEW.state, NEW.created_by,
            NEW.change_cause || ': model ' || NEW.model || ' (' || NEW.dimension
            || ' dimensions), chunker ' || NEW.chunker || ', backends ' || NEW.backends);
END;
CREATE TRIGGER generation_state_changed AFTER UPDATE OF state ON generations
WHEN NEW.state IS NOT OLD.state
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    SELECT CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_at ELSE now_micros END,
           'generation', NEW.id, 'state', OLD.state, NEW.state,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_by ELSE 'unattributed' END,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.change_cause ELSE 'unattributed_write' END
    FROM db_clock;
END;

ALTER TABLE jobs ADD COLUMN generation TEXT REFERENCES generations(id);
UPDATE jobs SET generation = (SELECT id FROM generations WHERE state = 'active')
WHERE kind IN ('project', 'tombstone');
CREATE INDEX jobs_by_generation ON jobs(generation, state) WHERE generation IS NOT NULL;

CREATE TABLE chunks_by_generation (
    revision_id TEXT    NOT NULL REFERENCES revisions(id),
    generation  TEXT    NOT NULL REFERENCES generations(id),
    chunk_index INTEGER NOT NULL CHECK (chunk_index >= 0),
    text        TEXT    NOT NULL,
    byte_start  INTEGER NOT NULL CHECK (byte_start >= 0),
    byte_end    INTEGER NOT NULL CHECK (byte_end >= byte_start),
    token_count INTEGER NOT NULL CHECK (token_count >= 0),
    sha256      TEXT    NOT NULL CHECK (length(sha256) = 64),
    PRIMARY KEY (revision_id, generation, chunk_index)
) STRICT, WITHOUT ROWID;
INSERT INTO chunks_by_generation (revision_id, generation, chunk_index, text, byte_start,
    byte_end, token_count, sha256)
SELECT revision_id, generation, chunk_index, text, byte_start, byte_end, token_count, sha256
FROM chunks;
DROP TABLE chunks;
ALTER TABLE chunks_by_generation RENAME TO chunks;
CREATE INDEX chunks_by_sha256 ON chunks(sha256, generation);
CREATE INDEX chunks_by_generation ON chunks(generation);
