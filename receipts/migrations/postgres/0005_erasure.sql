-- cairn ledger (PostgreSQL), schema 5: erasure (as SQLite schema 10). `erasures` records what
-- an erasure removed and its trigger writes the history row (who, why, when, content hashes,
-- never content); receipts gain the state `erased`.
ALTER TABLE projection_receipts DROP CONSTRAINT projection_receipts_state_check;
ALTER TABLE projection_receipts ADD CONSTRAINT projection_receipts_state_check
    CHECK (state IN ('pending', 'running', 'written', 'verified', 'excluded', 'failed',
                     'superseded', 'erased'));

CREATE TABLE erasures (
    revision_id        uuid   PRIMARY KEY REFERENCES revisions(id),
    dataset            text   NOT NULL,
    source_key         text   NOT NULL,
    revisions_erased   bigint NOT NULL CHECK (revisions_erased >= 0),
    content_sha256     jsonb  NOT NULL,
    contents_deleted   bigint NOT NULL CHECK (contents_deleted >= 0),
    chunk_rows_deleted bigint NOT NULL CHECK (chunk_rows_deleted >= 0),
    actor              text   NOT NULL,
    reason             text   NOT NULL,
    erased_at          bigint NOT NULL
);
CREATE INDEX erasures_by_source ON erasures (dataset, source_key);

CREATE FUNCTION erasure_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM history_add(true, NEW.erased_at, 'source', NEW.dataset || '/' || NEW.source_key,
        'erased', NULL, NEW.revision_id::text, NEW.actor,
        NEW.reason || ' (' || NEW.revisions_erased || ' revision(s) erased; content sha256 '
        || NEW.content_sha256::text || ')');
    RETURN NULL;
END $$;
CREATE TRIGGER erasure_history AFTER INSERT ON erasures
    FOR EACH ROW EXECUTE FUNCTION erasure_history();
