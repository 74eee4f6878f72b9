-- Receipts for submissions equal to the current head: the revision and its latest projection
-- job (`project` or `tombstone`; never its `graph` job).
-- ?1: JSON array of revision ids.
SELECT revision.id, revision.dataset, revision.source_key, revision.content_sha256,
       revision.byte_length, revision.accepted_at, revision.previous_revision_id, revision.tombstone,
       (SELECT job.id FROM jobs AS job WHERE job.revision_id = revision.id AND job.kind <> 'graph'
         ORDER BY job.created_at DESC, job.id DESC LIMIT 1) AS job_id
FROM revisions AS revision
WHERE revision.id IN (SELECT value FROM json_each(?1))
