-- Projection: the relational backend's chunk rows, projection generations, and the
-- generation each receipt belongs to.

-- A generation is the identity of a projection: embedding model, dimension, chunker settings
-- and backends. At most one is active; changing any part needs a new generation.
CREATE TABLE generations (
    id         TEXT    PRIMARY KEY,
    model      TEXT    NOT NULL,
    dimension  INTEGER NOT NULL CHECK (dimension > 0),
    chunker    TEXT    NOT NULL,
    backends   TEXT    NOT NULL CHECK (json_valid(backends)),
    active     INTEGER NOT NULL CHECK (active IN (0, 1)),
    created_at INTEGER NOT NULL,
    created_by TEXT    NOT NULL
) STRICT;
CREATE UNIQUE INDEX generations_one_active ON generations (active) WHERE active = 1;

CREATE TRIGGER generation_created AFTER INSERT ON generations
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.created_at, 'generation', NEW.id, 'state', NULL,
            CASE WHEN NEW.active = 1 THEN 'active' ELSE 'inactive' END, NEW.created_by,
            'model ' || NEW.model || ' (' || NEW.dimension || ' dimensions), chunker ' || NEW.chunker
            || ', backends ' || NEW.backends);
END;

-- Chunk rows of a revision (the relational backend). Content, not state: a revision's rows
-- are replaced whole by a fenced write; receipts record the state.
CREATE TABLE chunks (
    revision_id TEXT    NOT NULL REFERENCES revisions(id),
    chunk_index INTEGER NOT NULL CHECK (chunk_index >= 0),
    text        TEXT    NOT NULL,
    byte_start  INTEGER NOT NULL CHECK (byte_start >= 0),
    byte_end    INTEGER NOT NULL CHECK (byte_end >= byte_start),
    token_count INTEGER NOT NULL CHECK (token_count >= 0),
    sha256      TEXT    NOT NULL CHECK (length(sha256) = 64),
    generation  TEXT    NOT NULL REFERENCES generations(id),
    PRIMARY KEY (revision_id, chunk_index)
) STRICT, WITHOUT ROWID;

ALTER TABLE projection_receipts ADD COLUMN generation TEXT REFERENCES generations(id);
