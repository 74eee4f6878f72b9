-- cairn ledger (PostgreSQL), schema 13: connectors (as SQLite schema 14), which keep a dataset
-- equal to a folder or a git tree.
--
-- - `connectors`: one row per connector; creation and every state change are recorded in
--   `history` (entity `connector`) by the trigger below.
-- - `sources.owner`: NULL for a source that API ingest created, `connector:<id>` for one a
--   connector created. Only the owner moves a head (`receipts::acceptance`).
-- - `jobs` takes sync runs: kind `sync`, `connector_id` set and `revision_id` NULL. At most one
--   open run per connector (a unique partial index).
-- - `connector_files`: what the last committed step of a run saw of each file (a fingerprint:
--   size and mtime for a folder, the blob id for git, with its SHA-256).
-- - `sync_reports`: the report of each run, kept with its job.
CREATE TABLE connectors (
    id             uuid    PRIMARY KEY,
    dataset        text    NOT NULL,
    kind           text    NOT NULL CHECK (kind IN ('folder', 'git')),
    location       text    NOT NULL CHECK (length(location) > 0),
    git_ref        text,
    include        jsonb   NOT NULL,
    exclude        jsonb   NOT NULL,
    max_file_bytes bigint  NOT NULL CHECK (max_file_bytes > 0),
    interval_ms    bigint  NOT NULL CHECK (interval_ms >= 1000),
    state          text    NOT NULL CHECK (state IN ('active', 'paused', 'removed')),
    removal        text    CHECK (removal IN ('keep', 'tombstone')),
    created_by     text    NOT NULL,
    reason         text    NOT NULL,
    created_at     bigint  NOT NULL,
    changed_by     text    NOT NULL,
    change_cause   text    NOT NULL,
    changed_at     bigint  NOT NULL,
    change_seq     bigint  NOT NULL DEFAULT 0,
    CHECK ((kind = 'git') = (git_ref IS NOT NULL)),
    CHECK ((state = 'removed') = (removal IS NOT NULL))
);
CREATE INDEX connectors_by_dataset ON connectors (dataset);

ALTER TABLE sources ADD COLUMN owner text;
CREATE INDEX sources_by_owner ON sources (owner, dataset, source_key COLLATE "C")
    WHERE owner IS NOT NULL;

ALTER TABLE history DROP CONSTRAINT history_entity_check;
ALTER TABLE history ADD CONSTRAINT history_entity_check CHECK (entity IN ('source', 'job',
    'receipt', 'block', 'token', 'pause', 'generation', 'connector'));

-- A sync run's `source_key` is empty (no source key is).
ALTER TABLE jobs ALTER COLUMN revision_id DROP NOT NULL;
ALTER TABLE jobs ADD COLUMN connector_id uuid REFERENCES connectors(id);
ALTER TABLE jobs DROP CONSTRAINT jobs_kind_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_kind_check
    CHECK (kind IN ('project', 'tombstone', 'graph', 'sync'));
ALTER TABLE jobs ADD CONSTRAINT jobs_sync_names_its_connector
    CHECK ((kind = 'sync') = (connector_id IS NOT NULL));
ALTER TABLE jobs ADD CONSTRAINT jobs_sync_has_no_revision
    CHECK ((kind = 'sync') = (revision_id IS NULL));
CREATE INDEX jobs_by_connector ON jobs (connector_id, created_at) WHERE connector_id IS NOT NULL;
-- Two workers never run one connector at once: one open run per connector.
CREATE UNIQUE INDEX jobs_one_open_run ON jobs (connector_id)
    WHERE connector_id IS NOT NULL AND state IN ('pending', 'running', 'retry_wait');

CREATE FUNCTION connector_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM history_add(true, NEW.changed_at, 'connector', NEW.id::text, 'state', NULL,
            NEW.state, NEW.changed_by, NEW.change_cause);
    ELSE
        PERFORM history_add(NEW.change_seq > OLD.change_seq, NEW.changed_at, 'connector',
            NEW.id::text, 'state', OLD.state,
            CASE WHEN NEW.state = 'removed' THEN 'removed:' || NEW.removal ELSE NEW.state END,
            NEW.changed_by, NEW.change_cause);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER connector_created AFTER INSERT ON connectors
    FOR EACH ROW EXECUTE FUNCTION connector_history();
CREATE TRIGGER connector_state_changed AFTER UPDATE ON connectors FOR EACH ROW
    WHEN (NEW.state IS DISTINCT FROM OLD.state)
    EXECUTE FUNCTION connector_history();

CREATE TABLE connector_files (
    connector_id uuid NOT NULL REFERENCES connectors(id),
    source_key   text NOT NULL,
    fingerprint  text NOT NULL,
    sha256       text NOT NULL CHECK (length(sha256) = 64),
    PRIMARY KEY (connector_id, source_key)
);

CREATE TABLE sync_reports (
    job_id       uuid   PRIMARY KEY REFERENCES jobs(id),
    connector_id uuid   NOT NULL REFERENCES connectors(id),
    report       jsonb  NOT NULL,
    updated_at   bigint NOT NULL
);
CREATE INDEX sync_reports_by_connector ON sync_reports (connector_id, updated_at);
