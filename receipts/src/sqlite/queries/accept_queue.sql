-- Acceptance, step 4: supersede the previous heads' unfinished work, queue the new jobs with one
-- pending receipt per backend (and, with the graph backend, a `graph` job with its own `graph`
-- receipt), and swap the lexical passages to the new heads. The job whose id the receipt names
-- writes the active generation; every other live generation (one being built, or a former
-- active one kept for rollback) gets a job of its own, with a receipt per backend it holds.
-- An item that moves the head supersedes the source's unfinished jobs but those scheduled at or
-- after its period's end; one that does not (scheduled from a later instant, or history only)
-- supersedes only the scheduled jobs inside its period, which it overrides. A scheduled item's
-- jobs wait for `run_at`; a history-only item's job is superseded at once; both keep their
-- passages in `past_passages` until the head moves to them. A bounded period that holds now or
-- later queues the return of the revision holding after it, at its end.
DELETE FROM wave_superseded;
INSERT INTO wave_superseded (job_id, actor, cause)
SELECT job.id, wave.actor, 'superseded_by:' || wave.revision_id
FROM wave AS wave
CROSS JOIN jobs AS job ON job.dataset = wave.dataset AND job.source_key = wave.source_key
WHERE job.state IN ('pending', 'running', 'retry_wait')
  AND CASE WHEN wave.moves_head = 1 THEN job.state <> 'pending' OR job.run_at < wave.valid_to
           ELSE job.state = 'pending' AND job.run_at > (SELECT now FROM wave_params)
                AND job.run_at >= wave.valid_from AND job.run_at < wave.valid_to END
  -- An erasure's jobs erase the stores whatever comes next.
  AND NOT EXISTS (SELECT 1 FROM erasures AS erased WHERE erased.revision_id = job.revision_id);
UPDATE projection_receipts
SET state = 'superseded', updated_at = (SELECT now FROM wave_params),
    changed_by = (SELECT actor FROM wave_superseded AS gone WHERE gone.job_id = projection_receipts.job_id),
    change_cause = (SELECT cause FROM wave_superseded AS gone WHERE gone.job_id = projection_receipts.job_id),
    changed_at = (SELECT now FROM wave_params), change_seq = change_seq + 1
WHERE job_id IN (SELECT job_id FROM wave_superseded)
  AND state IN ('pending', 'running', 'written');
UPDATE jobs
SET state = 'superseded', lease_id = NULL, lease_owner = NULL, lease_expires_at = NULL,
    changed_by = (SELECT actor FROM wave_superseded AS gone WHERE gone.job_id = jobs.id),
    change_cause = (SELECT cause FROM wave_superseded AS gone WHERE gone.job_id = jobs.id),
    changed_at = (SELECT now FROM wave_params), change_seq = change_seq + 1
WHERE id IN (SELECT job_id FROM wave_superseded);
INSERT INTO jobs (id, revision_id, dataset, source_key, kind, state, attempt, max_attempts,
    run_at, run_at_rule, created_at, changed_by, change_cause, changed_at, generation)
SELECT job_id, revision_id, dataset, source_key, kind, job_state, 0, (SELECT max_attempts FROM job_policies AS policy WHERE policy.kind = wave.kind), run_at,
    CASE WHEN run_at > (SELECT now FROM wave_params) THEN 'scheduled: its validity starts then' ELSE 'accepted' END, (SELECT now FROM wave_params), actor, cause, (SELECT now FROM wave_params),
    (SELECT id FROM generations WHERE state = 'active')
FROM wave;
INSERT INTO projection_receipts (job_id, backend, state, updated_at, changed_by, change_cause,
    changed_at)
SELECT wave.job_id, backend.value, wave.job_state, (SELECT now FROM wave_params), wave.actor, wave.cause, (SELECT now FROM wave_params)
FROM wave AS wave, json_each((SELECT backends FROM wave_params)) AS backend;
INSERT INTO jobs (id, revision_id, dataset, source_key, kind, state, attempt, max_attempts,
    run_at, run_at_rule, created_at, changed_by, change_cause, changed_at, generation)
SELECT lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' || substr(hex(randomblob(2)), 2)
         || '-' || substr('89ab', 1 + abs(random() % 4), 1) || substr(hex(randomblob(2)), 2) || '-'
         || hex(randomblob(6))),
    wave.revision_id, wave.dataset, wave.source_key, wave.kind, 'pending', 0, (SELECT max_attempts FROM job_policies AS policy WHERE policy.kind = wave.kind), wave.run_at,
    CASE WHEN wave.run_at > (SELECT now FROM wave_params) THEN 'scheduled: its validity starts then' ELSE 'accepted' END, (SELECT now FROM wave_params), wave.actor, wave.cause, (SELECT now FROM wave_params),
    g.id
FROM wave CROSS JOIN generations AS g WHERE g.state IN ('building', 'standby') AND wave.job_state = 'pending';
INSERT INTO projection_receipts (job_id, backend, state, updated_at, changed_by, change_cause,
    changed_at)
SELECT job.id, backend.value, 'pending', (SELECT now FROM wave_params), job.changed_by, job.change_cause, (SELECT now FROM wave_params)
-- `CROSS JOIN` keeps the wave outside: SQLite knows nothing of the temp table's size and
-- otherwise walked every job by its revision index, once per wave (single acceptances fell
-- from 453/s to 72/s over three rounds of `bench accept` as the jobs grew).
FROM wave
CROSS JOIN jobs AS job ON job.revision_id = wave.revision_id AND job.id <> wave.job_id
    AND job.kind = wave.kind AND job.state = 'pending'
    AND job.created_at = (SELECT now FROM wave_params)
JOIN generations AS g ON g.id = job.generation AND g.state IN ('building', 'standby'),
    json_each(g.backends) AS backend
WHERE backend.value <> 'graph';
INSERT INTO jobs (id, revision_id, dataset, source_key, kind, state, attempt, max_attempts,
    run_at, run_at_rule, created_at, changed_by, change_cause, changed_at)
SELECT graph_job_id, revision_id, dataset, source_key, 'graph', 'pending', 0, (SELECT max_attempts FROM job_policies AS policy WHERE policy.kind = 'graph'), run_at,
    CASE WHEN run_at > (SELECT now FROM wave_params) THEN 'scheduled: its validity starts then' ELSE 'accepted' END, (SELECT now FROM wave_params), actor, cause, (SELECT now FROM wave_params)
FROM wave WHERE graph_job_id IS NOT NULL;
INSERT INTO projection_receipts (job_id, backend, state, updated_at, changed_by, change_cause,
    changed_at)
SELECT graph_job_id, 'graph', 'pending', (SELECT now FROM wave_params), actor, cause, (SELECT now FROM wave_params)
FROM wave WHERE graph_job_id IS NOT NULL;
INSERT INTO jobs (id, revision_id, dataset, source_key, kind, state, attempt, max_attempts,
    run_at, run_at_rule, created_at, changed_by, change_cause, changed_at, generation)
SELECT wave.return_job_id, wave.return_revision_id, wave.dataset, wave.source_key, returned.kind,
    'pending', 0, (SELECT max_attempts FROM job_policies AS policy WHERE policy.kind = returned.kind),
    wave.return_at, 'scheduled: a bounded validity ends then', (SELECT now FROM wave_params), wave.actor, 'validity_returns', (SELECT now FROM wave_params),
    (SELECT id FROM generations WHERE state = 'active')
FROM wave
JOIN (SELECT id, CASE WHEN tombstone = 1 THEN 'tombstone' ELSE 'project' END AS kind
      FROM revisions) AS returned ON returned.id = wave.return_revision_id
WHERE wave.return_job_id IS NOT NULL;
INSERT INTO projection_receipts (job_id, backend, state, updated_at, changed_by, change_cause,
    changed_at)
SELECT wave.return_job_id, backend.value, 'pending', (SELECT now FROM wave_params), wave.actor, 'validity_returns', (SELECT now FROM wave_params)
FROM wave AS wave, json_each((SELECT backends FROM wave_params)) AS backend
WHERE wave.return_job_id IS NOT NULL;
INSERT INTO jobs (id, revision_id, dataset, source_key, kind, state, attempt, max_attempts,
    run_at, run_at_rule, created_at, changed_by, change_cause, changed_at)
SELECT return_graph_job_id, return_revision_id, dataset, source_key, 'graph', 'pending', 0, (SELECT max_attempts FROM job_policies AS policy WHERE policy.kind = 'graph'), return_at, 'scheduled: a bounded validity ends then', (SELECT now FROM wave_params), actor, 'validity_returns', (SELECT now FROM wave_params)
FROM wave WHERE return_graph_job_id IS NOT NULL;
INSERT INTO projection_receipts (job_id, backend, state, updated_at, changed_by, change_cause,
    changed_at)
SELECT return_graph_job_id, 'graph', 'pending', (SELECT now FROM wave_params), actor, 'validity_returns', (SELECT now FROM wave_params)
FROM wave WHERE return_graph_job_id IS NOT NULL;
DELETE FROM passages
WHERE (dataset, source_key) IN (SELECT dataset, source_key FROM wave WHERE moves_head = 1);
INSERT INTO passages (dataset, source_key, revision_id, passage_index, byte_start, byte_end,
    text, section, page)
SELECT wave.dataset, wave.source_key, wave.revision_id, passage.passage_index, passage.byte_start,
       passage.byte_end, passage.text, passage.section, passage.page
FROM wave_passages AS passage
JOIN wave ON wave.position = passage.position
WHERE wave.moves_head = 1;
INSERT INTO passages_fts (rowid, text)
SELECT indexed.id,
       coalesce(indexed.text, CAST(substr(content.bytes, indexed.byte_start + 1,
                                          indexed.byte_end - indexed.byte_start) AS TEXT))
FROM wave
JOIN passages AS indexed ON indexed.revision_id = wave.revision_id
JOIN contents AS content ON content.sha256 = wave.sha256
WHERE wave.tombstone = 0 AND wave.moves_head = 1;
INSERT INTO past_passages (dataset, source_key, revision_id, passage_index, byte_start, byte_end,
    text, section, page)
SELECT wave.dataset, wave.source_key, wave.revision_id, passage.passage_index, passage.byte_start,
       passage.byte_end, passage.text, passage.section, passage.page
FROM wave_passages AS passage
JOIN wave ON wave.position = passage.position
WHERE wave.archive = 1;
INSERT INTO past_passages_fts (rowid, text)
SELECT archived.id,
       coalesce(archived.text, CAST(substr(content.bytes, archived.byte_start + 1,
                                           archived.byte_end - archived.byte_start) AS TEXT))
FROM wave
JOIN past_passages AS archived ON archived.revision_id = wave.revision_id
JOIN contents AS content ON content.sha256 = wave.sha256
WHERE wave.archive = 1;
