-- Acceptance write parameters, staged in one row so that the steps that follow take none.
-- ?1: now, ?2: JSON array of wave rows, ?3: JSON array of passage offsets
-- [position, passage_index, byte_start, byte_end], ?4: JSON array of [sha256, byte_length, offset],
-- ?5: JSON array of the names of the backends a `project` or `tombstone` job writes (the graph
-- has jobs of its own), ?6: every content's bytes end to end (one blob),
-- ?7: 1 to run every step now (through the
-- `accept_wave` trigger, inside this one statement), 0 to run them one by one, ?8: the wave's
-- validity writes (`receipts::acceptance::ValidityRows` as JSON).
INSERT OR REPLACE INTO wave_params (id, now, rows, passages, contents, backends, bytes, run_steps,
    assertions)
VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8);
