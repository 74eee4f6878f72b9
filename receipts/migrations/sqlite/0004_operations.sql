-- cairn ledger, schema 4: what operators see.
--
-- A running job reports the stage it is in (chunking, embedding, vector write, ...). The stage
-- is progress, not state: it lives on the job row, written by the fenced `progress` call, and
-- leaves no history row of its own (each run's stage at its end is in `history` below).
ALTER TABLE jobs ADD COLUMN stage TEXT;
ALTER TABLE jobs ADD COLUMN stage_at INTEGER;

-- Every run that ends in an error records that error in the job's history row, so the trail
-- holds each attempt's error (not only the last one on the job row). Filled by the trigger,
-- never by application code: a run leaving `running` for retry_wait, dead, cancelled or
-- quarantined, or back to pending after a lost lease, carries the job's error fields.
ALTER TABLE history ADD COLUMN error_code TEXT;
ALTER TABLE history ADD COLUMN error_message TEXT;
-- The stage a run had reached when it ended.
ALTER TABLE history ADD COLUMN stage TEXT;

DROP TRIGGER job_state_changed;
CREATE TRIGGER job_state_changed AFTER UPDATE OF state ON jobs
WHEN NEW.state IS NOT OLD.state
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause,
                        error_code, error_message, stage)
    SELECT CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_at ELSE now_micros END,
           'job', NEW.id, 'state', OLD.state, NEW.state,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_by ELSE 'unattributed' END,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.change_cause ELSE 'unattributed_write' END,
           CASE WHEN OLD.state = 'running' AND (NEW.state IN ('retry_wait', 'dead', 'cancelled', 'quarantined')
                     OR (NEW.state = 'pending' AND NEW.crashes > OLD.crashes))
                THEN NEW.last_error_code END,
           CASE WHEN OLD.state = 'running' AND (NEW.state IN ('retry_wait', 'dead', 'cancelled', 'quarantined')
                     OR (NEW.state = 'pending' AND NEW.crashes > OLD.crashes))
                THEN NEW.last_error_message END,
           CASE WHEN OLD.state = 'running' THEN OLD.stage END
    FROM db_clock;
END;

-- When a job was first claimed (enqueue-to-start is measured from acceptance to the first
-- claim; later claims are retries). Set by the claim, kept by every later one.
ALTER TABLE jobs ADD COLUMN first_started_at INTEGER;
UPDATE jobs SET first_started_at = (SELECT min(at) FROM history
    WHERE entity = 'job' AND entity_id = jobs.id AND to_state = 'running');
CREATE INDEX jobs_by_first_start ON jobs(first_started_at, created_at)
    WHERE first_started_at IS NOT NULL;

-- Job activity per minute, counted from the history as it is written (a trigger on history,
-- so it can never disagree with the trail): the dashboard reads 60 rows, not an hour of
-- history. `queued_delta` is the change of the queue depth (pending + retry_wait).
CREATE TABLE job_minutes (
    minute       INTEGER PRIMARY KEY, -- epoch minutes
    claimed      INTEGER NOT NULL DEFAULT 0,
    completed    INTEGER NOT NULL DEFAULT 0,
    retried      INTEGER NOT NULL DEFAULT 0,
    failed       INTEGER NOT NULL DEFAULT 0,
    queued_delta INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE TRIGGER job_minute_counted AFTER INSERT ON history WHEN NEW.entity = 'job'
BEGIN
    INSERT INTO job_minutes (minute, claimed, completed, retried, failed, queued_delta)
    VALUES (NEW.at / 60000000, NEW.to_state = 'running', NEW.to_state = 'completed',
            NEW.to_state = 'retry_wait', NEW.to_state IN ('dead', 'quarantined'),
            coalesce(NEW.to_state IN ('pending', 'retry_wait'), 0)
              - coalesce(NEW.from_state IN ('pending', 'retry_wait'), 0))
    ON CONFLICT (minute) DO UPDATE SET
        claimed = claimed + excluded.claimed, completed = completed + excluded.completed,
        retried = retried + excluded.retried, failed = failed + excluded.failed,
        queued_delta = queued_delta + excluded.queued_delta;
END;
INSERT INTO job_minutes (minute, claimed, completed, retried, failed, queued_delta)
SELECT at / 60000000, sum(to_state = 'running'), sum(to_state = 'completed'),
       sum(to_state = 'retry_wait'), sum(to_state IN ('dead', 'quarantined')),
       sum(coalesce(to_state IN ('pending', 'retry_wait'), 0))
         - sum(coalesce(from_state IN ('pending', 'retry_wait'), 0))
FROM history WHERE entity = 'job' GROUP BY at / 60000000;
CREATE INDEX jobs_by_error ON jobs(last_error_code) WHERE last_error_code IS NOT NULL;
-- Completed projections by completion time, covering the accepted-to-searchable latency. Partial:
-- an entry is written once per job, at completion, never on the acceptance path.
CREATE INDEX jobs_completed ON jobs(changed_at, created_at)
    WHERE state = 'completed' AND kind = 'project';
