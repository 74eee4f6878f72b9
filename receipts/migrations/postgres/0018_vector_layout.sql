-- A Qdrant cluster's collection layout (shard count, replication factor, write consistency
-- factor) is part of a generation's identity: a collection laid out otherwise is another
-- projection. Empty: the store's defaults (qdrant-edge, or a server's own defaults), as every
-- generation recorded before this column had.
ALTER TABLE generations ADD COLUMN vector_layout TEXT NOT NULL DEFAULT '';
