-- Acceptance, step 5: validity time (`receipts::validity`). The wave's assertions, then the
-- believed rectangles they override closed at each one's record time, then the new rectangles.
INSERT INTO assertions (id, dataset, source_key, seq, revision_id, valid_from, valid_to,
    recorded_at, actor, cause)
SELECT a.value ->> 'id', a.value ->> 'dataset', a.value ->> 'source_key', a.value ->> 'seq',
       a.value ->> 'revision_id', a.value ->> 'valid_from', a.value ->> 'valid_to',
       a.value ->> 'recorded_at', a.value ->> 'actor', a.value ->> 'cause'
FROM wave_params AS p, json_each(p.assertions, '$.assertions') AS a;
UPDATE validity
SET recorded_to = (SELECT c.value ->> 1 FROM wave_params AS p, json_each(p.assertions, '$.close') AS c
                   WHERE c.value ->> 0 = validity.id)
WHERE id IN (SELECT c.value ->> 0 FROM wave_params AS p, json_each(p.assertions, '$.close') AS c);
INSERT INTO validity (id, dataset, source_key, revision_id, assertion_id, valid_from, valid_to,
    recorded_from)
SELECT r.value ->> 'id', r.value ->> 'dataset', r.value ->> 'source_key',
       r.value ->> 'revision_id', r.value ->> 'assertion_id', r.value ->> 'valid_from',
       r.value ->> 'valid_to', r.value ->> 'recorded_from'
FROM wave_params AS p, json_each(p.assertions, '$.insert') AS r;
