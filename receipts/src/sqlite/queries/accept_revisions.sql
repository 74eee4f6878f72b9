-- Acceptance, step 2: new revisions (a reverted head reuses its existing revision).
INSERT INTO revisions (id, dataset, source_key, content_sha256, byte_length, media_type, tags,
    metadata, tombstone, previous_revision_id, actor, reason, accepted_at)
SELECT revision_id, dataset, source_key, sha256, byte_length, media_type, tags, metadata,
       tombstone, previous_revision_id, actor, reason, (SELECT now FROM wave_params)
FROM wave WHERE new_revision = 1;
