-- Acceptance write parameters, staged once so that the steps that follow take none.
-- ?1: now, ?2: JSON array of wave rows, ?3: JSON array of passage offsets
-- [position, passage_index, byte_start, byte_end], ?4: JSON array of [sha256, byte_length, hex],
-- ?5: max attempts, ?6: JSON array of backend names.
DELETE FROM temp.wave_params;
INSERT INTO temp.wave_params (now, rows, passages, contents, max_attempts, backends)
VALUES (?1, ?2, ?3, ?4, ?5, ?6);
