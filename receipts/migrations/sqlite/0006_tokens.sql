-- cairn ledger, schema 6: the token lifecycle.
--
-- A token may expire, and is revoked or rotated by a named actor for a stated reason. The
-- columns below carry who and why on the same UPDATE that revokes, so the history trigger
-- records them; a raw `UPDATE tokens SET revoked_at = ...` from another client is still
-- recorded, as actor `unattributed`. A rotation revokes the old token with `replaced_by` set
-- and creates the new one in the same transaction.
ALTER TABLE tokens ADD COLUMN expires_at INTEGER;
ALTER TABLE tokens ADD COLUMN revoked_by TEXT;
ALTER TABLE tokens ADD COLUMN revoke_reason TEXT;
ALTER TABLE tokens ADD COLUMN replaced_by TEXT;

DROP TRIGGER token_revoked;
CREATE TRIGGER token_revoked AFTER UPDATE OF revoked_at ON tokens
WHEN NEW.revoked_at IS NOT NULL AND OLD.revoked_at IS NULL
BEGIN
    INSERT INTO history(at, entity, entity_id, event, from_state, to_state, actor, cause)
    VALUES (NEW.revoked_at, 'token', NEW.id,
            CASE WHEN NEW.replaced_by IS NULL THEN 'revoked' ELSE 'rotated' END,
            'active', CASE WHEN NEW.replaced_by IS NULL THEN 'revoked' ELSE NEW.replaced_by END,
            CASE WHEN NEW.revoked_by IS NOT OLD.revoked_by THEN NEW.revoked_by ELSE 'unattributed' END,
            coalesce(CASE WHEN NEW.revoked_by IS NOT OLD.revoked_by THEN NEW.revoke_reason END,
                     'unattributed_write'));
END;
