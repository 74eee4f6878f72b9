-- cairn ledger (PostgreSQL), schema 14: connectors at work (SQLite runs the same rules from
-- `receipts::sqlite::connectors` and its acceptance query).
--
-- - The acceptance decision also answers who owns each source and whether that owner is a
--   removed connector (`receipts::connectors::ownership` decides with them).
-- - Every claim first schedules connector runs (`receipts::connectors`, priority 1 as
--   `SYNC_PRIORITY`): an active connector
--   without an open run gets one, due one interval after its last run changed state (now if
--   it never ran); a removed connector whose removal tombstones gets one now while it still
--   owns a live source. Concurrent claims meet the one-open-run index and do nothing.
DROP FUNCTION cairn_decide(text[], text[], text[], uuid[]);
CREATE FUNCTION cairn_decide(p_datasets text[], p_keys text[], p_hashes text[],
    p_revisions uuid[])
RETURNS TABLE (item_position bigint, head uuid, head_tombstone boolean, blocked_reason text,
               existing_accepted_at bigint, owner text, owner_removed boolean)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT item.position, s.head_revision_id, h.tombstone,
           (SELECT b.reason FROM content_blocks b
             WHERE b.dataset = item.dataset AND b.sha256 = item.sha256),
           (SELECT r.accepted_at FROM revisions r WHERE r.id = item.revision_id),
           s.owner,
           coalesce((SELECT c.state = 'removed' FROM connectors c
                      WHERE c.id::text = substr(s.owner, 11)), false)
    FROM unnest(p_datasets, p_keys, p_hashes, p_revisions) WITH ORDINALITY
         AS item(dataset, source_key, sha256, revision_id, position)
    LEFT JOIN sources s ON s.dataset = item.dataset AND s.source_key = item.source_key
    LEFT JOIN revisions h ON h.id = s.head_revision_id
    ORDER BY item.position;
END $$;

CREATE FUNCTION cairn_schedule_runs(p_now bigint, p_policies jsonb)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO jobs (id, revision_id, connector_id, dataset, source_key, kind, state,
        priority, max_attempts, run_at, run_at_rule, created_at, changed_by, change_cause,
        changed_at)
    SELECT gen_random_uuid(), NULL, c.id, c.dataset, '', 'sync', 'pending', 1, p.max_attempts,
           CASE WHEN c.state = 'removed' THEN p_now
                ELSE GREATEST(p_now, coalesce((SELECT last.changed_at FROM jobs last
                    WHERE last.connector_id = c.id ORDER BY last.created_at DESC LIMIT 1)
                    + c.interval_ms * 1000, p_now)) END,
           CASE WHEN c.state = 'removed'
                THEN 'last run: tombstone what the removed connector created'
                ELSE 'every ' || (c.interval_ms / 1000) || ' s after the last run' END,
           p_now, 'cairn:scheduler', 'scheduled', p_now
    FROM connectors c
    JOIN jsonb_to_recordset(p_policies) AS p(kind text, max_attempts bigint) ON p.kind = 'sync'
    WHERE (c.state = 'active'
           OR (c.state = 'removed' AND c.removal = 'tombstone' AND EXISTS (
               SELECT 1 FROM sources s JOIN revisions h ON h.id = s.head_revision_id
               WHERE s.owner = 'connector:' || c.id AND NOT h.tombstone)))
      AND NOT EXISTS (SELECT 1 FROM jobs o WHERE o.connector_id = c.id
                      AND o.state IN ('pending', 'running', 'retry_wait'))
    ON CONFLICT (connector_id)
        WHERE connector_id IS NOT NULL AND state IN ('pending', 'running', 'retry_wait')
        DO NOTHING;
END $$;

ALTER FUNCTION cairn_claim(bigint, text, bigint, jsonb) RENAME TO cairn_claim_due;
CREATE FUNCTION cairn_claim(p_now bigint, p_owner text, p_limit bigint, p_policies jsonb)
RETURNS SETOF jobs LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cairn_schedule_runs(coalesce(p_now, cairn_db_now()), p_policies);
    RETURN QUERY SELECT * FROM cairn_claim_due(p_now, p_owner, p_limit, p_policies);
END $$;
