-- cairn ledger (PostgreSQL), schema 12: every change of `tokens` is announced on `cairn_tokens`.
-- Each process keeps the tokens it authenticated for a moment (`postgres::tokens`); an update,
-- delete or truncate of `tokens` by anyone (a revocation or rotation in another process, or a
-- raw statement from psql) makes every listening process forget them when it commits. New
-- tokens need no announcement: unknown secrets are never kept.
CREATE FUNCTION tokens_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('cairn_tokens', '');
    RETURN NULL;
END $$;
CREATE TRIGGER tokens_changed AFTER UPDATE OR DELETE OR TRUNCATE ON tokens
    FOR EACH STATEMENT EXECUTE FUNCTION tokens_changed();
