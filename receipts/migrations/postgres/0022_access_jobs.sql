-- cairn ledger, schema 22: access jobs (see the SQLite schema 21). An access change queues
-- one `access` job per live generation that holds vectors; it names its source and generation
-- and no revision.
ALTER TABLE jobs DROP CONSTRAINT jobs_kind_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_kind_check
    CHECK (kind IN ('project', 'tombstone', 'graph', 'sync', 'access'));
ALTER TABLE jobs DROP CONSTRAINT jobs_sync_has_no_revision;
ALTER TABLE jobs ADD CONSTRAINT jobs_runs_and_access_have_no_revision
    CHECK ((kind IN ('sync', 'access')) = (revision_id IS NULL));
CREATE INDEX jobs_pending_access ON jobs (dataset, source_key, generation)
    WHERE kind = 'access' AND state = 'pending';
