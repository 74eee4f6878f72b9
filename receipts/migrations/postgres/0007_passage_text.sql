-- cairn ledger (PostgreSQL), schema 7: as SQLite schema 12, a passage of a format that
-- extracts (HTML) keeps its own text; NULL when it is cut from the retained bytes.
ALTER TABLE passages ADD COLUMN text text;
