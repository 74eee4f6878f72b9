-- The writer connection's staging tables for one wave of acceptances (connection-local).
CREATE TEMP TABLE IF NOT EXISTS wave (
    position             INTEGER PRIMARY KEY,
    dataset              TEXT NOT NULL,
    source_key           TEXT NOT NULL,
    revision_id          TEXT NOT NULL,
    new_revision         INTEGER NOT NULL,
    tombstone            INTEGER NOT NULL,
    sha256               TEXT,
    byte_length          INTEGER NOT NULL,
    media_type           TEXT NOT NULL,
    tags                 TEXT NOT NULL,
    metadata             TEXT NOT NULL,
    previous_revision_id TEXT,
    actor                TEXT NOT NULL,
    reason               TEXT,
    cause                TEXT NOT NULL,
    job_id               TEXT NOT NULL,
    kind                 TEXT NOT NULL,
    graph_job_id         TEXT,
    owner                TEXT,
    bucket               INTEGER NOT NULL,
    -- 1: the head moves to the revision now; 0: it is scheduled (validity from `run_at`).
    moves_head           INTEGER NOT NULL,
    -- When its jobs may run.
    run_at               INTEGER NOT NULL,
    -- 1: a scheduled revision's passages go to `past_passages` (none there yet).
    archive              INTEGER NOT NULL,
    -- The asserted period: which scheduled jobs it overrides.
    valid_from           INTEGER NOT NULL,
    valid_to             INTEGER NOT NULL,
    -- 'pending', or 'superseded' for a revision that holds only in the past.
    job_state            TEXT NOT NULL,
    -- A bounded period's end: the job that returns the head to the revision holding then.
    return_job_id        TEXT,
    return_revision_id   TEXT,
    return_at            INTEGER,
    return_graph_job_id  TEXT,
    UNIQUE (dataset, source_key)
);
CREATE TEMP TABLE IF NOT EXISTS wave_passages (
    position      INTEGER NOT NULL,
    passage_index INTEGER NOT NULL,
    byte_start    INTEGER NOT NULL,
    byte_end      INTEGER NOT NULL,
    text          TEXT,
    section       TEXT,
    page          INTEGER,
    PRIMARY KEY (position, passage_index)
);
-- Small columns first: reading one never walks the overflow pages of the large JSON ones.
CREATE TEMP TABLE IF NOT EXISTS wave_params (
    id           INTEGER PRIMARY KEY CHECK (id = 1),
    now          INTEGER NOT NULL,
    backends     TEXT NOT NULL,
    run_steps    INTEGER NOT NULL CHECK (run_steps IN (0, 1)),
    rows         TEXT NOT NULL,
    passages     TEXT NOT NULL,
    contents     TEXT NOT NULL,
    -- `receipts::acceptance::ValidityRows` as JSON.
    assertions   TEXT NOT NULL DEFAULT '{"assertions":[],"close":[],"insert":[]}',
    bytes        BLOB NOT NULL
);
CREATE TEMP TABLE IF NOT EXISTS wave_superseded (
    job_id TEXT PRIMARY KEY,
    actor  TEXT NOT NULL,
    cause  TEXT NOT NULL
);
-- The writer's job policy per kind (from its configuration), read by claims, heartbeats,
-- rescues and acceptance so that SQL and Rust apply one policy.
CREATE TEMP TABLE IF NOT EXISTS job_policies (
    kind                     TEXT PRIMARY KEY,
    max_attempts             INTEGER NOT NULL,
    lease_micros             INTEGER NOT NULL,
    max_run_micros           INTEGER NOT NULL,
    quarantine_after_crashes INTEGER NOT NULL
);
