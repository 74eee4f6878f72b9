-- cairn ledger, schema 8: chunk rows by text hash, so a projection finds a verified vector of
-- the same text (in the same dataset and generation) to reuse instead of embedding it again.
CREATE INDEX chunks_by_sha256 ON chunks(sha256, generation);
