-- cairn ledger (PostgreSQL), schema 8: a passage names where it lies in its document, as chunk
-- rows do (schema 6): the section it starts in (formats with headings) and its page (paged
-- formats; a passage never spans two pages). NULL where the format has neither.
ALTER TABLE passages ADD COLUMN section TEXT;
ALTER TABLE passages ADD COLUMN page BIGINT CHECK (page IS NULL OR page >= 1);
