-- cairn ledger, schema 12: a passage of a format that extracts (HTML) keeps its own text,
-- since its byte range points into the extracted text, not into the retained markup. NULL for
-- every other passage: its text is cut from the retained bytes, never stored twice.
ALTER TABLE passages ADD COLUMN text TEXT;
