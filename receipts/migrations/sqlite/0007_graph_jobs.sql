-- cairn ledger, schema 7: `graph` jobs. With the graph backend configured, every accepted
-- revision (content or tombstone) also gets a `graph` job with its own `graph` receipt, so the
-- graph has its own retries and dead state and never holds up the other backends.
--
-- SQLite cannot alter a CHECK constraint, so `kind` is replaced by a column with the wider
-- check (the only index that names it is dropped and rebuilt; no trigger or view names it).
DROP INDEX jobs_completed;
ALTER TABLE jobs ADD COLUMN kind_checked TEXT NOT NULL DEFAULT 'project'
    CHECK (kind_checked IN ('project', 'tombstone', 'graph'));
UPDATE jobs SET kind_checked = kind;
ALTER TABLE jobs DROP COLUMN kind;
ALTER TABLE jobs RENAME COLUMN kind_checked TO kind;
CREATE INDEX jobs_completed ON jobs(changed_at, created_at)
    WHERE state = 'completed' AND kind = 'project';
