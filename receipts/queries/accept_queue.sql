-- Acceptance, step 4: supersede the previous heads' unfinished work, queue the new jobs with one
-- pending receipt per backend, and swap the lexical passages to the new heads.
UPDATE projection_receipts
SET state = 'superseded', updated_at = (SELECT now FROM temp.wave_params), changed_by = wave.actor,
    change_cause = 'superseded_by:' || wave.revision_id, changed_at = (SELECT now FROM temp.wave_params),
    change_seq = projection_receipts.change_seq + 1
FROM temp.wave AS wave
JOIN jobs AS job ON job.dataset = wave.dataset AND job.source_key = wave.source_key
WHERE projection_receipts.job_id = job.id
  AND job.state IN ('pending', 'running', 'retry_wait')
  AND projection_receipts.state IN ('pending', 'running', 'written');
UPDATE jobs
SET state = 'superseded', lease_id = NULL, lease_owner = NULL, lease_expires_at = NULL,
    changed_by = wave.actor, change_cause = 'superseded_by:' || wave.revision_id,
    changed_at = (SELECT now FROM temp.wave_params), change_seq = jobs.change_seq + 1
FROM temp.wave AS wave
WHERE jobs.dataset = wave.dataset AND jobs.source_key = wave.source_key
  AND jobs.state IN ('pending', 'running', 'retry_wait');
INSERT INTO jobs (id, revision_id, dataset, source_key, kind, state, attempt, max_attempts,
    run_at, created_at, changed_by, change_cause, changed_at)
SELECT job_id, revision_id, dataset, source_key, kind, 'pending', 0, (SELECT max_attempts FROM temp.wave_params), (SELECT now FROM temp.wave_params), (SELECT now FROM temp.wave_params), actor, cause, (SELECT now FROM temp.wave_params)
FROM temp.wave;
INSERT INTO projection_receipts (job_id, backend, state, updated_at, changed_by, change_cause,
    changed_at)
SELECT wave.job_id, backend.value, 'pending', (SELECT now FROM temp.wave_params), wave.actor, wave.cause, (SELECT now FROM temp.wave_params)
FROM temp.wave AS wave, json_each((SELECT backends FROM temp.wave_params)) AS backend;
DELETE FROM passages
WHERE (dataset, source_key) IN (SELECT dataset, source_key FROM temp.wave);
INSERT INTO passages (dataset, source_key, revision_id, passage_index, byte_start, byte_end, text)
SELECT wave.dataset, wave.source_key, wave.revision_id, passage.passage_index, passage.byte_start,
       passage.byte_end,
       CAST(substr(content.bytes, passage.byte_start + 1, passage.byte_end - passage.byte_start) AS TEXT)
FROM temp.wave_passages AS passage
JOIN temp.wave AS wave ON wave.position = passage.position
JOIN contents AS content ON content.sha256 = wave.sha256;
