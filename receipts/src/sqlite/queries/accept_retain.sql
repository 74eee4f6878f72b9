-- Acceptance, step 1: stage the wave and retain the bytes (once per sha256).
-- Passage text is not sent, unless it is extracted (HTML): it is cut from the retained bytes in
-- step 4.
DELETE FROM wave;
DELETE FROM wave_passages;
INSERT INTO wave (position, dataset, source_key, revision_id, new_revision, tombstone,
    sha256, byte_length, media_type, tags, metadata, previous_revision_id, actor, reason, cause,
    job_id, kind, graph_job_id, owner, bucket, moves_head, run_at, archive, valid_from, valid_to,
    job_state, return_job_id, return_revision_id, return_at, return_graph_job_id)
SELECT value ->> 'position', value ->> 'dataset', value ->> 'source_key', value ->> 'revision_id',
       value ->> 'new_revision', value ->> 'tombstone', value ->> 'sha256', value ->> 'byte_length',
       value ->> 'media_type', value ->> 'tags', value ->> 'metadata',
       value ->> 'previous_revision_id', value ->> 'actor', value ->> 'reason', value ->> 'cause',
       value ->> 'job_id', value ->> 'kind', value ->> 'graph_job_id', value ->> 'owner',
       value ->> 'bucket', value ->> 'moves_head', value ->> 'run_at',
       value ->> 'moves_head' = 0 AND value ->> 'tombstone' = 0
         AND NOT EXISTS (SELECT 1 FROM past_passages AS archived
                         WHERE archived.revision_id = value ->> 'revision_id'),
       value ->> 'valid_from', value ->> 'valid_to', value ->> 'job_state',
       value ->> 'return_job_id', value ->> 'return_revision_id', value ->> 'return_at',
       value ->> 'return_graph_job_id'
FROM json_each((SELECT rows FROM wave_params));
INSERT INTO wave_passages (position, passage_index, byte_start, byte_end, text, section, page)
SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5, value ->> 6
FROM json_each((SELECT passages FROM wave_params));
INSERT INTO contents (sha256, byte_length, bytes, created_at)
SELECT value ->> 0, value ->> 1, substr((SELECT bytes FROM wave_params), (value ->> 2) + 1, value ->> 1),
       (SELECT now FROM wave_params)
FROM json_each((SELECT contents FROM wave_params)) WHERE TRUE
ON CONFLICT (sha256) DO NOTHING;
