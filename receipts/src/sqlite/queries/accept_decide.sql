-- Acceptance, step 0: what the ledger holds for each item of a wave (no two items of a wave
-- share a source), with who owns the source (`receipts::connectors::ownership`). ?1: JSON array of {dataset, source_key, sha256, revision_id}.
SELECT
    CAST(item.key AS INTEGER) AS position,
    source.head_revision_id AS head,
    head.tombstone AS head_tombstone,
    (SELECT block.reason FROM content_blocks AS block
      WHERE block.dataset = item.value ->> 'dataset' AND block.sha256 = item.value ->> 'sha256') AS blocked_reason,
    (SELECT revision.accepted_at FROM revisions AS revision
      WHERE revision.id = item.value ->> 'revision_id') AS existing_accepted_at,
    source.owner AS owner,
    coalesce((SELECT connector.state = 'removed' FROM connectors AS connector
               WHERE connector.id = substr(source.owner, 11)), 0) AS owner_removed,
    -- Validity (schema 16): the source's last assertion and its believed rectangles.
    (SELECT max(assertion.seq) FROM assertions AS assertion
      WHERE assertion.dataset = item.value ->> 'dataset'
        AND assertion.source_key = item.value ->> 'source_key') AS last_seq,
    (SELECT max(assertion.recorded_at) FROM assertions AS assertion
      WHERE assertion.dataset = item.value ->> 'dataset'
        AND assertion.source_key = item.value ->> 'source_key') AS last_recorded_at,
    (SELECT json_group_array(json_array(rectangle.id, rectangle.assertion_id,
                rectangle.revision_id, rectangle.valid_from, rectangle.valid_to,
                rectangle.recorded_from))
       FROM validity AS rectangle
      WHERE rectangle.dataset = item.value ->> 'dataset'
        AND rectangle.source_key = item.value ->> 'source_key'
        AND rectangle.recorded_to = 9007199254740991) AS believed
FROM json_each(?1) AS item
LEFT JOIN sources AS source
    ON source.dataset = item.value ->> 'dataset' AND source.source_key = item.value ->> 'source_key'
LEFT JOIN revisions AS head ON head.id = source.head_revision_id
ORDER BY position
