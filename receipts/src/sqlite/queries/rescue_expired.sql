-- Rescue of expired leases, run with every claim: the job goes back to pending charged one
-- crash (not an attempt), to quarantined once its crashes reach the limit, or to cancelled if
-- an operator asked it to stop. ?1: now, ?2: claiming worker. The quarantine threshold is the
-- job kind's (`temp.job_policies`).
UPDATE jobs SET
    state = CASE WHEN cancel_requested = 1 THEN 'cancelled'
                 WHEN crashes + 1 >= (SELECT quarantine_after_crashes FROM job_policies AS policy WHERE policy.kind = jobs.kind) THEN 'quarantined' ELSE 'pending' END,
    crashes = crashes + 1,
    last_error_code = 'lease_expired',
    last_error_message = 'lease of ' || lease_owner || ' expired at '
        || strftime('%Y-%m-%dT%H:%M:%fZ', lease_expires_at / 1000000.0, 'unixepoch')
        || ' (last heartbeat ' || coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', heartbeat_at / 1000000.0, 'unixepoch'), 'never')
        || ', stage ' || coalesce(stage, 'none') || ')',
    lease_id = NULL, lease_owner = NULL, lease_expires_at = NULL, heartbeat_at = NULL,
    deadline_at = NULL, stage = NULL, stage_at = NULL, run_at = ?1, run_at_rule = 'rescued after its lease expired',
    changed_by = 'cairn:rescuer (claim by ' || ?2 || ')',
    change_cause = CASE WHEN cancel_requested = 1 THEN 'lease_expired; cancel requested earlier'
                        WHEN crashes + 1 >= (SELECT quarantine_after_crashes FROM job_policies AS policy WHERE policy.kind = jobs.kind) THEN 'lease_expired; quarantined after ' || (crashes + 1) || ' lost leases'
                        ELSE 'lease_expired' END,
    changed_at = ?1, change_seq = change_seq + 1
WHERE state = 'running' AND lease_expires_at <= ?1;
