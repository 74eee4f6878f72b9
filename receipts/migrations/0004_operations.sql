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

-- Job events in time order (dashboard charts, latency percentiles) and error codes (filters).
CREATE INDEX history_jobs_by_time ON history(at) WHERE entity = 'job';
CREATE INDEX jobs_by_error ON jobs(last_error_code) WHERE last_error_code IS NOT NULL;
CREATE INDEX jobs_by_state_changed ON jobs(state, changed_at);
