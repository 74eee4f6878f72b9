-- cairn ledger (PostgreSQL), schema 2: `graph` jobs. With the graph backend configured, every
-- accepted revision (content or tombstone) also gets a `graph` job with its own `graph`
-- receipt, so the graph has its own retries and dead state and never holds up the other
-- backends.
ALTER TABLE jobs DROP CONSTRAINT jobs_kind_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_kind_check CHECK (kind IN ('project', 'tombstone', 'graph'));
