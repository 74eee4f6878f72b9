-- cairn ledger, schema 24: connectors that read remotes.
--
-- - `connectors.credentials`: the name of a file inside the workers' credentials folder
--   (`connectors.credentials_dir`) that holds an HTTP token or basic credentials, or an SSH
--   key and its `known_hosts`, and the secret push hooks are verified with
--   (`connectors::remote`). The ledger holds the name, never a secret. NULL: the
--   environment's credentials, or none.
-- - `connector_deliveries`: the push-hook deliveries that made a connector's run due, by the
--   provider's delivery id, so that a replayed delivery changes nothing. Written in the same
--   transaction as the run-now change it caused, and recorded in `history` (entity
--   `connector`, event `hook`, the delivery as `to_state`, with its actor and cause) by the
--   trigger below; the rows themselves are kept 7 days, history for good.
ALTER TABLE connectors ADD COLUMN credentials TEXT;

CREATE TABLE connector_deliveries (
    connector_id TEXT    NOT NULL REFERENCES connectors (id),
    delivery_id  TEXT    NOT NULL CHECK (length(delivery_id) BETWEEN 1 AND 200),
    received_at  INTEGER NOT NULL,
    actor        TEXT    NOT NULL,
    cause        TEXT    NOT NULL,
    PRIMARY KEY (connector_id, delivery_id)
) STRICT, WITHOUT ROWID;

CREATE TRIGGER connector_delivery_received AFTER INSERT ON connector_deliveries
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.received_at, 'connector', NEW.connector_id, 'hook', NULL, NEW.delivery_id,
            NEW.actor, NEW.cause);
END;
