-- cairn ledger (PostgreSQL), schema 24: webhook subscriptions and their deliveries (as SQLite
-- schema 23). Every change to a subscription is recorded in `history` (entity `webhook`) by
-- the trigger below. A claim locks its subscription's row, so the fan-out (which moves
-- `cursor`) and the claim of one subscription run one at a time across processes; the outbox
-- numbers events at commit, so a cursor never passes an event that commits later.
ALTER TABLE history DROP CONSTRAINT history_entity_check;
ALTER TABLE history ADD CONSTRAINT history_entity_check CHECK (entity IN ('source', 'job',
    'receipt', 'block', 'token', 'pause', 'generation', 'connector', 'verify', 'drift', 'restore',
    'access', 'webhook'));

CREATE TABLE webhooks (
    id                     uuid   PRIMARY KEY,
    url                    text   NOT NULL CHECK (length(url) > 0),
    events                 jsonb  NOT NULL CHECK (jsonb_typeof(events) = 'array'),
    datasets               jsonb  CHECK (datasets IS NULL OR jsonb_typeof(datasets) = 'array'),
    description            text   NOT NULL,
    state                  text   NOT NULL CHECK (state IN ('active', 'paused', 'disabled', 'deleted')),
    disabled_reason        text,
    sealed_secret          text   NOT NULL,
    previous_sealed_secret text,
    previous_secret_until  bigint,
    cursor                 bigint NOT NULL CHECK (cursor >= 0),
    created_by             text   NOT NULL,
    created_at             bigint NOT NULL,
    changed_by             text   NOT NULL,
    change_cause           text   NOT NULL,
    changed_at             bigint NOT NULL,
    last_action            text   NOT NULL,
    change_seq             bigint NOT NULL DEFAULT 0
);

CREATE TABLE deliveries (
    webhook_id   uuid   NOT NULL REFERENCES webhooks(id),
    seq          bigint NOT NULL,
    lane         text   NOT NULL,
    state        text   NOT NULL CHECK (state IN ('pending', 'delivering', 'delivered', 'dead', 'discarded')),
    attempt      bigint NOT NULL DEFAULT 0,
    next_at      bigint NOT NULL,
    first_at     bigint NOT NULL,
    fence        bigint NOT NULL DEFAULT 0,
    lease_owner  text,
    lease_until  bigint,
    last_status  bigint,
    last_error   text,
    delivered_at bigint,
    PRIMARY KEY (webhook_id, seq)
);
-- Open deliveries in sequence order: a claim walks only these, never the delivered history.
CREATE INDEX deliveries_open ON deliveries (webhook_id, seq)
    WHERE state IN ('pending', 'delivering');
CREATE INDEX deliveries_by_lane ON deliveries (webhook_id, lane COLLATE "C", seq)
    WHERE state IN ('pending', 'delivering');
CREATE INDEX deliveries_dead ON deliveries (webhook_id, seq) WHERE state = 'dead';

CREATE FUNCTION webhook_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM history_add(true, NEW.changed_at, 'webhook', NEW.id::text, NEW.last_action,
            NULL, NEW.state, NEW.changed_by, NEW.change_cause);
    ELSE
        PERFORM history_add(NEW.change_seq > OLD.change_seq, NEW.changed_at, 'webhook',
            NEW.id::text,
            CASE WHEN NEW.change_seq > OLD.change_seq THEN NEW.last_action ELSE 'state' END,
            OLD.state, NEW.state, NEW.changed_by, NEW.change_cause);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER webhook_created AFTER INSERT ON webhooks
    FOR EACH ROW EXECUTE FUNCTION webhook_history();
CREATE TRIGGER webhook_changed AFTER UPDATE ON webhooks FOR EACH ROW
    WHEN (NEW.change_seq IS DISTINCT FROM OLD.change_seq OR NEW.state IS DISTINCT FROM OLD.state)
    EXECUTE FUNCTION webhook_history();
