-- cairn ledger, schema 11: where a chunk sits in its document. `section` is the heading path
-- it starts in (`# A > ## B`), `page` its first page (1-based), each NULL when the format has
-- none. Search results carry both.
ALTER TABLE chunks ADD COLUMN section TEXT;
ALTER TABLE chunks ADD COLUMN page INTEGER CHECK (page IS NULL OR page >= 1);
