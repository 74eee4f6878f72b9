-- cairn ledger (PostgreSQL), schema 9: history written per statement where it pays, and with
-- plans that are kept.
-- - A job's state changes are recorded per statement, as its creation already is. The row
--   trigger `job_changed` called `history_add` once per changed row, and every one of those
--   inserts fired `job_minutes_counted` again: about 100 us per job and transition, half of the
--   server's time in a claim or a grouped completion of 32 jobs. Now `jobs_changed` writes the
--   same rows (state first, then a cancel request, per job) with one INSERT ... SELECT over the
--   statement's transition tables.
-- - The job activity per minute (`job_minutes`) is counted by the two triggers that write a
--   job's history, from the rows they write (`RETURNING`), so it still cannot disagree with the
--   trail. It was a statement trigger on every insert into `history`, which fired for every
--   history write of every entity: each receipt change paid a PL/pgSQL call that counted
--   nothing, and an acceptance wave three where one counts.
-- - `history_add`, which the remaining row triggers call (a receipt's state change, a head
--   move, a block, a token, a pause, a generation), is PL/pgSQL instead of SQL, with the same
--   arguments and the same row. A SQL function's statement is parsed and planned again at
--   every call; a PL/pgSQL function keeps its plan for the session. 20,000 calls in a loop (a
--   DO block, twice each): 775 and 731 ms as SQL, 269 and 272 ms as PL/pgSQL.
DROP TRIGGER job_changed ON jobs;
DROP FUNCTION job_changed();
DROP TRIGGER job_minutes_counted ON history;
DROP FUNCTION job_minutes_counted();

-- Adds job history rows just written (the `at`, `from_state` and `to_state` of their `state`
-- events) to this backend's shard of their minutes; returns how many minutes it touched.
CREATE FUNCTION job_minutes_add(p_at bigint[], p_from text[], p_to text[]) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    touched bigint;
BEGIN
    INSERT INTO job_minutes AS m (minute, shard, claimed, completed, retried, failed,
                                  queued_delta)
    SELECT e.at / 60000000, pg_backend_pid() % 16,
           count(*) FILTER (WHERE e.to_state = 'running'),
           count(*) FILTER (WHERE e.to_state = 'completed'),
           count(*) FILTER (WHERE e.to_state = 'retry_wait'),
           count(*) FILTER (WHERE e.to_state IN ('dead', 'quarantined')),
           count(*) FILTER (WHERE e.to_state IN ('pending', 'retry_wait'))
             - count(*) FILTER (WHERE e.from_state IN ('pending', 'retry_wait'))
    FROM unnest(p_at, p_from, p_to) AS e(at, from_state, to_state)
    GROUP BY e.at / 60000000
    ON CONFLICT (minute, shard) DO UPDATE SET
        claimed = m.claimed + excluded.claimed, completed = m.completed + excluded.completed,
        retried = m.retried + excluded.retried, failed = m.failed + excluded.failed,
        queued_delta = m.queued_delta + excluded.queued_delta;
    GET DIAGNOSTICS touched = ROW_COUNT;
    RETURN touched;
END $$;

CREATE OR REPLACE FUNCTION jobs_created() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    minutes bigint;
BEGIN
    WITH written AS (
        INSERT INTO history (at, entity, entity_id, event, from_state, to_state, actor, cause)
        SELECT changed_at, 'job', id::text, 'state', NULL, state, changed_by, change_cause
        FROM new_rows
        RETURNING at, from_state, to_state)
    SELECT job_minutes_add(array_agg(at), array_agg(from_state), array_agg(to_state))
    INTO minutes FROM written;
    RETURN NULL;
END $$;

CREATE FUNCTION jobs_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    minutes bigint;
BEGIN
    -- Most updates of `jobs` that change no state (heartbeats) stop here.
    IF NOT EXISTS (
        SELECT 1 FROM new_rows n JOIN old_rows o ON o.id = n.id
        WHERE n.state IS DISTINCT FROM o.state
           OR (n.cancel_requested AND NOT o.cancel_requested)) THEN
        RETURN NULL;
    END IF;
    WITH written AS (
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
        ORDER BY c.id, c.ordinal
        RETURNING at, event, from_state, to_state)
    SELECT job_minutes_add(array_agg(at) FILTER (WHERE event = 'state'),
                           array_agg(from_state) FILTER (WHERE event = 'state'),
                           array_agg(to_state) FILTER (WHERE event = 'state'))
    INTO minutes FROM written;
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_changed AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_changed();

CREATE OR REPLACE FUNCTION history_add(attributed boolean, changed_at bigint, entity text,
    entity_id text, event text, from_state text, to_state text, actor text, cause text,
    error_code text DEFAULT NULL, error_message text DEFAULT NULL, stage text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO history (at, entity, entity_id, event, from_state, to_state, actor, cause,
                         error_code, error_message, stage)
    VALUES (CASE WHEN attributed THEN changed_at ELSE cairn_db_now() END, entity, entity_id,
            event, from_state, to_state,
            CASE WHEN attributed THEN actor ELSE 'unattributed' END,
            CASE WHEN attributed THEN cause ELSE 'unattributed_write' END,
            error_code, error_message, stage);
END $$;
