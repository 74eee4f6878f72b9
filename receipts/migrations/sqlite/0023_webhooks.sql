-- cairn ledger, schema 23: webhook subscriptions and their deliveries (`receipts::webhooks`).
--
-- - `webhooks`: one row per subscription, its secrets sealed by the process that signs (the
--   ledger never holds one in clear). `cursor` is the last outbox event fanned out to it.
--   Creation and every change (state, secret rotation, an operator's action on its
--   deliveries) are recorded in `history` (entity `webhook`) by the triggers below, with the
--   actor, reason and action carried on the row; `history` takes the entity through the
--   schema edit schema 14 used (see there), made before the `CREATE TABLE` that bumps the
--   schema cookie.
-- - `deliveries`: one row per event and subscription, a leased job. `lane` orders a source's
--   events; `fence` numbers claims.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
SET sql = replace(sql, '''restore'', ''access''))', '''restore'', ''access'', ''webhook''))')
WHERE type = 'table' AND name = 'history';
PRAGMA writable_schema = OFF;

CREATE TABLE webhooks (
    id                     TEXT    PRIMARY KEY,
    url                    TEXT    NOT NULL CHECK (length(url) > 0),
    events                 TEXT    NOT NULL CHECK (json_valid(events) AND json_type(events) = 'array'),
    datasets               TEXT    CHECK (datasets IS NULL OR (json_valid(datasets) AND json_type(datasets) = 'array')),
    description            TEXT    NOT NULL,
    state                  TEXT    NOT NULL CHECK (state IN ('active', 'paused', 'disabled', 'deleted')),
    disabled_reason        TEXT,
    sealed_secret          TEXT    NOT NULL,
    previous_sealed_secret TEXT,
    previous_secret_until  INTEGER,
    cursor                 INTEGER NOT NULL CHECK (cursor >= 0),
    created_by             TEXT    NOT NULL,
    created_at             INTEGER NOT NULL,
    changed_by             TEXT    NOT NULL,
    change_cause           TEXT    NOT NULL,
    changed_at             INTEGER NOT NULL,
    last_action            TEXT    NOT NULL,
    change_seq             INTEGER NOT NULL DEFAULT 0
) STRICT, WITHOUT ROWID;

CREATE TEMP TABLE migration_guard (missed TEXT);
CREATE TEMP TRIGGER migration_guard_refused BEFORE INSERT ON migration_guard
BEGIN SELECT RAISE(ABORT, 'schema 23: the history definition was not edited'); END;
INSERT INTO migration_guard
SELECT name FROM sqlite_schema WHERE name = 'history' AND instr(sql, '''webhook''') = 0;
DROP TABLE migration_guard;

CREATE TABLE deliveries (
    webhook_id   TEXT    NOT NULL REFERENCES webhooks(id),
    seq          INTEGER NOT NULL,
    lane         TEXT    NOT NULL,
    state        TEXT    NOT NULL CHECK (state IN ('pending', 'delivering', 'delivered', 'dead', 'discarded')),
    attempt      INTEGER NOT NULL DEFAULT 0,
    next_at      INTEGER NOT NULL,
    first_at     INTEGER NOT NULL,
    fence        INTEGER NOT NULL DEFAULT 0,
    lease_owner  TEXT,
    lease_until  INTEGER,
    last_status  INTEGER,
    last_error   TEXT,
    delivered_at INTEGER,
    PRIMARY KEY (webhook_id, seq)
) STRICT, WITHOUT ROWID;
-- The claim's scans: what is due, and what is still open ahead in a lane.
-- Open deliveries in sequence order: a claim walks only these, never the delivered history.
CREATE INDEX deliveries_open ON deliveries(webhook_id, seq)
    WHERE state IN ('pending', 'delivering');
CREATE INDEX deliveries_by_lane ON deliveries(webhook_id, lane, seq)
    WHERE state IN ('pending', 'delivering');
CREATE INDEX deliveries_dead ON deliveries(webhook_id, seq) WHERE state = 'dead';

CREATE TRIGGER webhook_created AFTER INSERT ON webhooks
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.changed_at, 'webhook', NEW.id, NEW.last_action, NULL, NEW.state,
            NEW.changed_by, NEW.change_cause);
END;
CREATE TRIGGER webhook_changed AFTER UPDATE ON webhooks
WHEN NEW.change_seq IS NOT OLD.change_seq OR NEW.state IS NOT OLD.state
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    SELECT CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_at ELSE now_micros END,
           'webhook', NEW.id,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.last_action ELSE 'state' END,
           OLD.state, NEW.state,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.changed_by ELSE 'unattributed' END,
           CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.change_cause ELSE 'unattributed_write' END
    FROM db_clock;
END;
