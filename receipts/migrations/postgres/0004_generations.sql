-- cairn ledger (PostgreSQL), schema 4: generations built side by side (as SQLite schema 9).
--
-- A generation has a life (`building`, `active`, `standby`, `retiring`, `retired`) instead of
-- an active flag; exactly one is active once any exists, and its state changes are recorded in
-- history by trigger. Jobs name the generation they write (NULL for graph jobs and for jobs
-- queued before any generation existed), and chunk rows are kept per generation.
ALTER TABLE generations ADD COLUMN state text NOT NULL DEFAULT 'standby'
    CHECK (state IN ('building', 'active', 'standby', 'retiring', 'retired'));
UPDATE generations SET state = CASE WHEN active THEN 'active' ELSE 'standby' END;
DROP INDEX generations_one_active;
ALTER TABLE generations DROP COLUMN active;
ALTER TABLE generations
    ADD COLUMN changed_by text NOT NULL DEFAULT '',
    ADD COLUMN change_cause text NOT NULL DEFAULT '',
    ADD COLUMN changed_at bigint NOT NULL DEFAULT 0,
    ADD COLUMN change_seq bigint NOT NULL DEFAULT 0,
    ADD COLUMN retired_evidence jsonb;
UPDATE generations SET changed_by = created_by, change_cause = 'created', changed_at = created_at;
CREATE UNIQUE INDEX generations_one_active ON generations (state) WHERE state = 'active';

CREATE OR REPLACE FUNCTION generation_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM history_add(true, NEW.created_at, 'generation', NEW.id, 'state', NULL,
            NEW.state, NEW.created_by,
            NEW.change_cause || ': model ' || NEW.model || ' (' || NEW.dimension
            || ' dimensions), chunker ' || NEW.chunker || ', backends ' || NEW.backends::text);
    ELSE
        PERFORM history_add(NEW.change_seq > OLD.change_seq, NEW.changed_at, 'generation',
            NEW.id, 'state', OLD.state, NEW.state, NEW.changed_by, NEW.change_cause);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER generation_state_changed AFTER UPDATE ON generations FOR EACH ROW
    WHEN (NEW.state IS DISTINCT FROM OLD.state)
    EXECUTE FUNCTION generation_history();

ALTER TABLE jobs ADD COLUMN generation text REFERENCES generations(id);
UPDATE jobs SET generation = (SELECT id FROM generations WHERE state = 'active')
WHERE kind IN ('project', 'tombstone');
CREATE INDEX jobs_by_generation ON jobs (generation, state) WHERE generation IS NOT NULL;

ALTER TABLE chunks DROP CONSTRAINT chunks_pkey;
ALTER TABLE chunks ADD PRIMARY KEY (revision_id, generation, chunk_index);
CREATE INDEX chunks_by_generation ON chunks (generation);
