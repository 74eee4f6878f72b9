-- cairn ledger (PostgreSQL), schema 9: a job's state changes are recorded per statement, as
-- its creation already is. The row trigger `job_changed` called `history_add` once per changed
-- row, and every one of those inserts fired `job_minutes_counted` again: about 100 us per job
-- and transition, half of the server's time in a claim or a grouped completion of 32 jobs.
-- Now one INSERT ... SELECT over the statement's transition tables writes the same rows (state
-- first, then a cancel request, per job), and the activity counter runs once per statement.
DROP TRIGGER job_changed ON jobs;
DROP FUNCTION job_changed();

CREATE FUNCTION jobs_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Most updates of `jobs` that change no state (heartbeats) stop here, before an insert
    -- that would fire the history's own statement trigger for nothing.
    IF NOT EXISTS (
        SELECT 1 FROM new_rows n JOIN old_rows o ON o.id = n.id
        WHERE n.state IS DISTINCT FROM o.state
           OR (n.cancel_requested AND NOT o.cancel_requested)) THEN
        RETURN NULL;
    END IF;
    INSERT INTO history (at, entity, entity_id, event, from_state, to_state, actor, cause,
                         error_code, error_message, stage)
    SELECT CASE WHEN c.attributed THEN c.changed_at ELSE cairn_db_now() END, 'job', c.id::text,
           c.event, c.from_state, c.to_state,
           CASE WHEN c.attributed THEN c.changed_by ELSE 'unattributed' END,
           CASE WHEN c.attributed THEN c.change_cause ELSE 'unattributed_write' END,
           c.error_code, c.error_message, c.stage
    FROM (
        -- A run leaving `running` for retry_wait, dead, cancelled or quarantined, or back to
        -- pending after a lost lease, carries the job's error, and every run its stage.
        SELECT n.id, 1 AS ordinal, n.change_seq > o.change_seq AS attributed, n.changed_at,
               n.changed_by, n.change_cause, 'state' AS event, o.state AS from_state,
               n.state AS to_state,
               CASE WHEN o.state = 'running'
                     AND (n.state IN ('retry_wait', 'dead', 'cancelled', 'quarantined')
                          OR (n.state = 'pending' AND n.crashes > o.crashes))
                    THEN n.last_error_code END AS error_code,
               CASE WHEN o.state = 'running'
                     AND (n.state IN ('retry_wait', 'dead', 'cancelled', 'quarantined')
                          OR (n.state = 'pending' AND n.crashes > o.crashes))
                    THEN n.last_error_message END AS error_message,
               CASE WHEN o.state = 'running' THEN o.stage END AS stage
        FROM new_rows n JOIN old_rows o ON o.id = n.id
        WHERE n.state IS DISTINCT FROM o.state
        UNION ALL
        SELECT n.id, 2, n.change_seq > o.change_seq, n.changed_at, n.changed_by,
               n.change_cause, 'cancel_requested', n.state, n.state, NULL, NULL, NULL
        FROM new_rows n JOIN old_rows o ON o.id = n.id
        WHERE n.cancel_requested AND NOT o.cancel_requested
    ) AS c
    ORDER BY c.id, c.ordinal;
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_changed AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_changed();
