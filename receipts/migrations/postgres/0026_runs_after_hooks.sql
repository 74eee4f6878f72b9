-- cairn ledger (PostgreSQL), schema 26: a push hook that arrives while a connector's run is
-- running makes the next run due at once (SQLite runs the same rule from
-- `receipts::sqlite::connectors::schedule`).
--
-- - The scheduling rule (schema 14) gains one case: an active connector whose last run
--   started before a push-hook delivery it took (`connector_deliveries`) gets its next run
--   now, not one interval after, since that run may have fetched before the push. A delivery
--   that made a run due arrived before that run started, so it asks for nothing more.
CREATE OR REPLACE FUNCTION cairn_schedule_runs(p_now bigint, p_policies jsonb)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO jobs (id, revision_id, connector_id, dataset, source_key, kind, state,
        priority, max_attempts, run_at, run_at_rule, created_at, changed_by, change_cause,
        changed_at)
    SELECT gen_random_uuid(), NULL, c.id, c.dataset, '', 'sync', 'pending', 1, p.max_attempts,
           CASE WHEN c.state = 'removed' OR pushed.after_last_start THEN p_now
                ELSE GREATEST(p_now, coalesce((SELECT last.changed_at FROM jobs last
                    WHERE last.connector_id = c.id ORDER BY last.created_at DESC LIMIT 1)
                    + c.interval_ms * 1000, p_now)) END,
           CASE WHEN c.state = 'removed'
                THEN 'last run: tombstone what the removed connector created'
                WHEN pushed.after_last_start
                THEN 'a push hook arrived while the last run ran'
                ELSE 'every ' || (c.interval_ms / 1000) || ' s after the last run' END,
           p_now, 'cairn:scheduler', 'scheduled', p_now
    FROM connectors c
    JOIN jsonb_to_recordset(p_policies) AS p(kind text, max_attempts bigint) ON p.kind = 'sync'
    CROSS JOIN LATERAL (
        SELECT EXISTS (
            SELECT 1 FROM connector_deliveries d
            WHERE d.connector_id = c.id
              AND d.received_at > (SELECT coalesce(last.started_at, last.created_at)
                                   FROM jobs last WHERE last.connector_id = c.id
                                   ORDER BY last.created_at DESC LIMIT 1)) AS after_last_start
    ) pushed
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
