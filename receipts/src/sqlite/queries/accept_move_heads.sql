-- Acceptance, step 3: move each source's head (the trigger records the move in history). The
-- owner becomes the submitter's: acceptance let the move through only if it may hold it. A
-- scheduled revision (validity from a later instant) leaves the head where it is.
INSERT INTO sources (dataset, source_key, head_revision_id, created_at, changed_by, change_cause,
    changed_at, change_seq, owner, bucket)
SELECT dataset, source_key, revision_id, (SELECT now FROM wave_params), actor, cause, (SELECT now FROM wave_params), 1, owner, bucket FROM wave WHERE moves_head = 1
ON CONFLICT (dataset, source_key) DO UPDATE SET
    head_revision_id = excluded.head_revision_id,
    owner = excluded.owner,
    changed_by = excluded.changed_by,
    change_cause = excluded.change_cause,
    changed_at = excluded.changed_at,
    change_seq = sources.change_seq + 1;
