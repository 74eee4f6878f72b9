-- cairn ledger (PostgreSQL), schema 19: the acceptance decision probes connectors by key, and
-- no ledger function is JIT-compiled.
-- Schema 14 looked up a source's owner as `connectors c WHERE c.id::text = substr(s.owner,
-- 11)`: a cast of the column, which no index serves. With sequential scans switched off in the
-- function (schema 11), that one scan cost the planner's "disabled" penalty (1e10), so every
-- call crossed `jit_above_cost` and PostgreSQL compiled the query to machine code before
-- running it: about 150-340 ms of LLVM per acceptance, whatever the table sizes (acceptance
-- fell from 1.2x the raw loop to 0.04x). The owner is now turned into a connector id (only a
-- well-formed `connector:<uuid>` is) and looked up by primary key, and the function carries
-- `jit = off`, as every ledger connection does since this release.
DROP FUNCTION cairn_decide(text[], text[], text[], uuid[]);
CREATE FUNCTION cairn_decide(p_datasets text[], p_keys text[], p_hashes text[],
    p_revisions uuid[])
RETURNS TABLE (item_position bigint, head uuid, head_tombstone boolean, blocked_reason text,
               existing_accepted_at bigint, owner text, owner_removed boolean)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_hashjoin = off
SET enable_mergejoin = off SET jit = off
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
                      WHERE c.id = CASE
                          WHEN s.owner ~ '^connector:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'
                          THEN substr(s.owner, 11)::uuid END), false)
    FROM unnest(p_datasets, p_keys, p_hashes, p_revisions) WITH ORDINALITY
         AS item(dataset, source_key, sha256, revision_id, position)
    LEFT JOIN sources s ON s.dataset = item.dataset AND s.source_key = item.source_key
    LEFT JOIN revisions h ON h.id = s.head_revision_id
    ORDER BY item.position;
END $$;

-- What the ledger believes about each item's validity (the source's last assertion and its
-- believed rectangles), read with the decision since schema 16. It was an unnamed statement,
-- planned again for every wave (a quarter of a millisecond of planning per wave, under 16
-- clients' small waves most of the server's time); as a function its one plan is kept, with
-- the same settings as `cairn_decide`: index probes at any size, never JIT.
CREATE FUNCTION cairn_believed(p_datasets text[], p_keys text[])
RETURNS TABLE (item_position bigint, last_seq bigint, last_recorded_at bigint, believed text)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_hashjoin = off
SET enable_mergejoin = off SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT w.position,
           (SELECT max(a.seq) FROM assertions a
             WHERE a.dataset = w.dataset AND a.source_key = w.source_key),
           (SELECT max(a.recorded_at) FROM assertions a
             WHERE a.dataset = w.dataset AND a.source_key = w.source_key),
           (SELECT coalesce(json_agg(json_build_array(v.id, v.assertion_id, v.revision_id,
                      v.valid_from, v.valid_to, v.recorded_from)), '[]')::text
              FROM validity v WHERE v.dataset = w.dataset AND v.source_key = w.source_key
               AND v.recorded_to = 9007199254740991)
    FROM unnest(p_datasets, p_keys) WITH ORDINALITY AS w(dataset, source_key, position)
    ORDER BY w.position;
END $$;
