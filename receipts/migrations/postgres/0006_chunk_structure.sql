-- cairn ledger (PostgreSQL), schema 6: where a chunk sits in its document (as SQLite schema
-- 11): the heading path it starts in and its first page, each NULL when the format has none.
ALTER TABLE chunks ADD COLUMN section text, ADD COLUMN page bigint CHECK (page IS NULL OR page >= 1);
