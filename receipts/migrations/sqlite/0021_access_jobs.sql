-- cairn ledger, schema 21: access jobs.
--
-- An access change queues one `access` job per live generation that holds vectors: it writes
-- the source's readers onto its points in that generation's store and reads them back, so the
-- store's prefilter follows the change (binding in the ledger decides what is returned either
-- way). An access job names its source and generation and no revision, like a sync run names
-- its connector: the jobs table's checks take the new kind through the schema edit schema 14
-- used (see there), made before the `CREATE INDEX` that bumps the schema cookie.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
SET sql = replace(replace(sql,
        '''graph'', ''sync''))', '''graph'', ''sync'', ''access''))'),
        'AND (kind = ''sync'') = (revision_id IS NULL)',
        'AND (kind IN (''sync'', ''access'')) = (revision_id IS NULL)')
WHERE type = 'table' AND name = 'jobs';
PRAGMA writable_schema = OFF;
-- One pending access job per source and generation is enough: it reads the readers when it
-- runs. This index finds it.
CREATE INDEX jobs_pending_access ON jobs(dataset, source_key, generation)
    WHERE kind = 'access' AND state = 'pending';

CREATE TEMP TABLE migration_guard (missed TEXT);
CREATE TEMP TRIGGER migration_guard_refused BEFORE INSERT ON migration_guard
BEGIN SELECT RAISE(ABORT, 'schema 21: the jobs definition was not edited'); END;
INSERT INTO migration_guard
SELECT name FROM sqlite_schema
WHERE name = 'jobs' AND (instr(sql, '''sync'', ''access''))') = 0
                         OR instr(sql, 'AND (kind IN (''sync'', ''access'')) = (revision_id') = 0);
DROP TABLE migration_guard;
