-- cairn ledger (PostgreSQL), schema 11: the acceptance decision keeps its plan.
-- The decision (what the ledger holds for each item of a wave: the source's head, whether it is
-- a tombstone, a block on the content, an existing revision with the item's id) was sent as an
-- unnamed statement and planned for every wave: about 0.2 ms of planning per wave, the largest
-- planning cost left in acceptance. A plan cached while the tables were small had once kept
-- scanning them whole as they grew (single acceptances fell from 374 to 109 per second over
-- three rounds), so this function's plan is kept with sequential scans, hash joins and merge
-- joins switched off: its only plan is the one it should have at any size, an index probe per
-- item.
CREATE FUNCTION cairn_decide(p_datasets text[], p_keys text[], p_hashes text[],
    p_revisions uuid[])
RETURNS TABLE (item_position bigint, head uuid, head_tombstone boolean, blocked_reason text,
               existing_accepted_at bigint)
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
           (SELECT r.accepted_at FROM revisions r WHERE r.id = item.revision_id)
    FROM unnest(p_datasets, p_keys, p_hashes, p_revisions) WITH ORDINALITY
         AS item(dataset, source_key, sha256, revision_id, position)
    LEFT JOIN sources s ON s.dataset = item.dataset AND s.source_key = item.source_key
    LEFT JOIN revisions h ON h.id = s.head_revision_id
    ORDER BY item.position;
END $$;
