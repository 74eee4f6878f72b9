"""cairn's API models, generated from its OpenAPI document: do not edit by hand.

Regenerate with ``python tools/generate_models.py openapi.json`` (clients/python/); the
client tests fail while this file differs from what the served document generates.
"""

# ruff: noqa: D205

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Model(BaseModel):
    """A model of cairn's answers: fields a newer server adds are kept, not refused."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)


class Acceptance(Model):
    """The receipt for an accepted submission: the bytes are durable, projection is queued."""

    accepted: bool
    """Always `true`: a refused submission is an error, not an acceptance."""
    status: str
    """Whether anything was created."""
    dataset: str
    """Dataset of the source."""
    source_key: str
    """Key of the source."""
    source_revision_id: str
    """The revision that is now head."""
    projection_job_id: str
    """The projection job for that revision."""
    content_sha256: str | None = None
    """SHA-256 of the retained bytes (absent for a tombstone)."""
    byte_length: int
    """Length of the retained bytes (0 for a tombstone)."""
    accepted_at: int
    """When the revision was first accepted."""
    previous_revision_id: str | None = None
    """The head this acceptance replaced, if any."""
    tombstone: bool
    """Whether the head is a tombstone."""


class AccessRecord(Model):
    """Who may read one source, as the ledger holds it now."""

    dataset: str
    """The dataset."""
    source_key: str
    """The source's key."""
    readers: list[str] | None = None
    """The readers the source names; `None`: it follows the dataset's default."""
    default: str
    """The dataset's default."""
    version: int
    """How many times the source's readers were set (0: never)."""
    changed_by: str | None = None
    """Who set them last."""
    changed_at: int | None = None


class AccessRequest(Model):
    """A change of a source's readers."""

    dataset: str
    """Dataset name: 1-128 characters, no `/`, no control characters, no surrounding
    whitespace.
    """
    source_key: str
    """The source's key in its dataset (a path, a URL, an id): 1-1024 characters, no control
    characters, no surrounding whitespace.
    """
    readers: list[str] | None = None
    """The readers (`user:<name>`, `service:<name>`, `group:<name>`; at most 256); `null`: back
    to the dataset's default.
    """
    reason: str | None = None
    """Why (recorded in history): 1-500 characters, no control characters."""


class ActionBody(Model):
    """The body of a one-job action."""

    reason: str | None = None
    """Why (recorded in history); at most 500 printable characters."""


class AddField(Model):
    """A metadata field to index."""

    field: str
    """`metadata.<name>`: 1 to 64 letters, digits, `_` or `-` after the prefix."""
    kind: str
    """`keyword` (strings), `number` or `bool`, as in `datasets.<d>.filterable`."""
    reason: str | None = None
    """Why (logged); at most 500 printable characters."""


class Assertion(Model):
    """One assertion, as the ledger records it (append-only)."""

    id: str
    """Its id."""
    seq: int
    """Its place among the source's assertions (1, 2, ...)."""
    revision_id: str
    """The revision asserted."""
    valid: Period
    """The period it asserts."""
    recorded_at: int
    """When cairn recorded it."""
    actor: str
    """Who asked."""
    cause: str
    """Why (`accepted`, `reverted_to_earlier_revision`, `deleted`, ...)."""


class BackupList(Model):
    """Backups listed."""

    backups: list[BackupView]
    """This process's backups, newest first."""


class BackupView(Model):
    """A backup's state in this process."""

    id: str
    """The backup's id (its folder's name)."""
    folder: str
    """Where it is written."""
    state: str
    """`running`, `completed` or `failed`."""
    error: str | None = None
    """Why it failed."""
    manifest: dict[str, Any] | None = None
    """The manifest, once written."""


class BatchRequest(Model):
    """The batch body: up to `limits.max_batch_items` (1000) items. Each item should be a
    `SourceRequest`; an item that is not one fails alone, with its error in the answer, and
    the others are accepted.
    """

    items: list[Any]


class BatchResponse(Model):
    """The batch answer: one entry per item, in request order: a receipt with its `index`, or
    `{index, accepted: false, http_status, code, message, details?}`.
    """

    results: list[dict[str, Any]]


class BlockRequest(Model):
    """Content to block in a dataset."""

    dataset: str
    """Dataset name: 1-128 characters, no `/`, no control characters, no surrounding
    whitespace.
    """
    content_sha256: str
    """SHA-256 of the exact bytes, 64 hex digits."""
    reason: str
    """Why (recorded in history): 1-500 characters, no control characters."""


class CancelBody(Model):
    """The CancelBody schema."""

    states: list[str] | None = None
    """States to act on (default: every state the action applies to)."""
    dataset: str | None = None
    """Dataset name: 1-128 characters, no `/`, no control characters, no surrounding
    whitespace.
    """
    error_code: str | None = None
    """Only jobs whose last error has this code."""
    q: str | None = None
    """Source key text, or a job or revision id."""
    dry_run: bool | None = None
    """Only list the candidates; change nothing (default false)."""
    reason: str | None = None
    """Why (recorded in history); at most 500 printable characters."""


class ChangeBody(Model):
    """A revocation or rotation."""

    reason: str | None = None
    """Why (recorded in history); at most 500 printable characters."""
    expires_in_seconds: int | None = None
    """Rotation only: the new token's lifetime in seconds (default: the old one's)."""


class Connector(Model):
    """A connector as stored."""

    id: str
    """Connector id (UUID v7)."""
    dataset: str
    """The dataset it keeps."""
    kind: str
    """Folder or git."""
    location: str
    """The folder's path, or the repository's path or URL."""
    git_ref: str | None = None
    """The git ref (branch, tag or commit); `None` for a folder."""
    include: list[str]
    """Globs over the key a file must match (empty: every file)."""
    exclude: list[str]
    """Globs over the key that leave a file out."""
    max_file_bytes: int
    """Largest file it reads, in bytes."""
    interval_ms: int
    """Time between the end of a run and the start of the next, in milliseconds."""
    access: ConnectorAccess | None = None
    """Who may read its sources, kept by each run."""
    credentials: str | None = None
    """A remote repository's credentials: the name of a file in the workers' credentials folder
    (never the secret itself); `None`: the environment's, or none.
    """
    state: str
    """Where it is in its life."""
    removal: str | None = None
    created_by: str
    """Who created it."""
    reason: str
    """Why it was created."""
    created_at: int
    """When it was created."""
    changed_by: str
    """Who made the last change."""
    change_cause: str
    """Why (the cause recorded in history)."""
    changed_at: int
    """When."""


class ConnectorAccess(Model):
    """Who may read the sources a connector keeps ([`crate::access`]). Nothing set: the
    connector never touches access, and its sources follow whatever access changes name (or
    their dataset's default). Set, each run computes every file's readers and records the
    ones that changed as access changes: no new revision, nothing embedded again.
    """

    readers: list[str] | None = None
    """Readers of every file that nothing else names (`user:<name>`, `service:<name>`,
    `group:<name>`); unset: the dataset's default.
    """
    from_: str | None = Field(None, alias="from")
    file: str | None = None
    """A git connector's rules file, a path inside the repository read at the run's commit
    (docs/operations.md, "Connectors", gives its format).
    """


class ConnectorChanged(Model):
    """What a connector change did."""

    connector: Connector
    """The connector after the change."""
    run: Job | None = None
    cancelled_runs: int
    """Runs cancelled by the change (pause, remove)."""


class ConnectorList(Model):
    """Every connector the token may read."""

    connectors: list[ConnectorSummary]


class ConnectorSummary(Model):
    """A connector with its open run and its last ended run."""

    connector: Connector
    open_run: Job | None = None
    last_run: SyncRun | None = None


class ConnectorView(Model):
    """A connector with its open run and latest runs."""

    connector: Connector
    runs: list[SyncRun]
    """The latest runs, newest first, with their reports."""
    history: list[HistoryEntry]
    """Its state changes, oldest first: who, why, when."""


class ContentBlock(Model):
    """An operator's block on exact content within a dataset."""

    dataset: str
    """Dataset the block applies to."""
    sha256: str
    """SHA-256 (lowercase hex) of the blocked bytes."""
    reason: str
    """Why it is blocked."""
    actor: str
    """Who blocked it."""


class CreateBody(Model):
    """A connector to create."""

    dataset: str
    """The dataset it keeps (the token must be allowed to ingest into it)."""
    kind: str
    """`folder`, or `git` (a repository on the workers' machines, read without a work tree, or
    a remote one, fetched into a mirror at every run).
    """
    location: str
    """The folder's or the repository's absolute path, inside a configured root; or a remote
    repository's URL (`https://`, `http://`, `ssh://`, `user@host:path`, `git://`) on a host
    in `connectors.remote_hosts`, without credentials.
    """
    credentials: str | None = None
    """A remote repository's credentials: the name of a file in the workers'
    `connectors.credentials_dir` (a token, basic credentials, or an SSH key with its
    `known_hosts`). Absent: the workers' `CAIRN_GIT_*` environment, or none.
    """
    ref: str | None = None
    """The git ref (a branch, a tag or a commit id): required for git, refused for a folder."""
    include: list[str] | None = None
    """Globs over the key a file must match (absent or empty: every file)."""
    exclude: list[str] | None = None
    """Globs over the key that leave a file out."""
    max_file_bytes: int | None = None
    """Largest file read, in bytes (default 10 MiB)."""
    interval_ms: int | None = None
    """Time between runs in milliseconds (1 s to 366 days; default 10 minutes)."""
    access: ConnectorAccess | None = None
    """Who may read the files it keeps, computed at every run apart from their content:
    `readers` for every file, `from: posix` (a folder: owner, group, mode bits and ACL),
    `file` (git: a rules file in the repository). Absent: the connector leaves access alone.
    """
    reason: str | None = None
    """Why (recorded in history)."""


class CreateGeneration(Model):
    """`POST /v1/ops/generations`: the settings of the generation to build."""

    max_tokens: int | None = None
    """Most tokens per chunk (default: the server's configuration)."""
    overlap_tokens: int | None = None
    """Tokens shared by neighbouring chunks (default: the server's configuration)."""
    model: str | None = None
    """Embedding model: a local model's id, a remote model's id, or `remote` for the configured
    embedding server's (default: the server's own model).
    """
    backends: list[str] | None = None
    """Backends (default: the server's)."""
    priority: int | None = None
    """Priority of the rebuild jobs (default -10: fresh ingest, at 0, goes first)."""
    reason: str | None = None
    """Why (history)."""


class DatasetAccess(Model):
    """A dataset's default, as set."""

    dataset: str
    default: str


class DefaultRequest(Model):
    """A change of a dataset's default."""

    default: str
    """`everyone` (who may read the dataset) or `nobody` (until a document names readers)."""
    reason: str | None = None
    """Why (recorded in history): 1-500 characters, no control characters."""


class DeliveriesBody(Model):
    """The body of an action on deliveries."""

    seq: int | None = None
    """One event's delivery (default: every dead one)."""
    reason: str | None = None
    """Why (recorded in history)."""


class DriftRecord(Model):
    """One confirmed drift, as the ledger keeps it."""

    id: str
    """Its id."""
    pass_id: str
    """The pass that found it."""
    kind: str
    """What kind."""
    store: str
    """Which store (`vector`, `relational`, `bytes`)."""
    generation: str
    """The generation."""
    dataset: str
    """Dataset."""
    source_key: str
    """Source key."""
    revision_id: str
    """The revision."""
    evidence: dict[str, Any]
    """What was expected and what was found."""
    state: str
    """Where it stands."""
    repair: str | None = None
    """What the repair did (a job it queued, points it retired), when one ran."""
    found_at: int
    """When it was confirmed."""
    changed_at: int
    """When it changed last."""


class Error(Model):
    """The schema of every error body, for the API document."""

    code: str
    """Stable machine-readable code (the README's error table lists them all)."""
    message: str
    """Human-readable explanation; never echoes a secret or an internal detail."""
    details: dict[str, Any] | None = None
    """Extra structured fields, per code (a limit, the field at fault, a dataset)."""


class FacetAnswer(Model):
    """What [`Searcher::facets`] answers."""

    facets: list[FacetCounts]
    """Each field counted within the budget, in the order asked."""
    facets_partial: list[str]
    """Fields left out: their count could not finish within the budget."""
    took_ms: float
    """Time from admission to answer."""


class FacetCount(Model):
    """A value and how many sources hold it."""

    value: bool | float | str
    """The value."""
    count: int
    """Matching sources that hold it."""


class FacetCounts(Model):
    """One field's counts."""

    field: str
    """The field, as asked."""
    sources: int
    """Matching sources, whatever their value."""
    missing: int
    """Matching sources with no value for the field."""
    values: list[FacetCount]
    """The most frequent values, most first (ties: booleans, numbers, strings, each in order)."""
    truncated: bool
    """More values exist than are listed."""
    exact: bool
    """Always `true`: counts are over every matching source, never estimated."""


class FilterableList(Model):
    """The indexed fields of every live generation that has a vector store."""

    generations: list[GenerationFields]
    """One entry per live generation."""


class GenerationFields(Model):
    """One live generation's indexed payload fields."""

    generation: str
    """The generation."""
    indexed: list[str]
    """The payload fields its store indexes, sorted."""


class GraphSources(Model):
    """The answer of `GET /v1/graph/sources`."""

    dataset: str
    """Dataset."""
    source_key: str
    """The asked source."""
    head_revision_id: str
    """Its current head revision."""
    links: list[LinkView]
    """Linked sources, outgoing first, by key."""


class HistoryEntry(Model):
    """One entry of the append-only history."""

    seq: int
    """Position in the ledger-wide history."""
    at: int
    """When it happened."""
    entity: str
    """`source`, `job`, `receipt`, `block` or `token`."""
    entity_id: str
    """Which one (e.g. the job id, `dataset/source_key`, `job_id/backend`)."""
    event: str
    """What happened (`state`, `head_moved`, `blocked`, ...)."""
    from_: str | None = Field(None, alias="from")
    """The state or head before."""
    to: str | None = None
    """The state or head after."""
    actor: str
    """Who made the change (`unattributed` for writes outside cairn)."""
    cause: str
    """Why."""
    error_code: str | None = None
    """A job run that ended in an error: the error's code."""
    error_message: str | None = None
    """... and its message."""
    stage: str | None = None
    """A job run's end: the stage it had reached."""


class HookAnswer(Model):
    """What a push hook did."""

    outcome: str
    """`run_due` (the run is due now, or already running), `ignored` (another ref or event), or
    `duplicate` (this delivery was taken already; nothing changed).
    """
    reason: str | None = None
    """Why, for `ignored` and `duplicate`."""
    run: Job | None = None


class Identity(Model):
    """The identity a request reads as: a principal (`user:<name>` or `service:<name>`) and the
    groups it belongs to (`group:<name>`).
    """

    principal: str
    """`user:<name>` or `service:<name>`."""
    groups: list[str]
    """`group:<name>` each, sorted, without repeats."""


class Job(Model):
    """A projection job as stored."""

    id: str
    """Job id (UUID v7)."""
    revision_id: str | None = None
    """The revision it projects (`None` for a sync run, which has none)."""
    connector_id: str | None = None
    """The connector a sync run runs (`None` for every other kind)."""
    dataset: str
    """Dataset."""
    source_key: str
    """Source key (empty for a sync run: no source key is empty)."""
    kind: str
    """What it does."""
    state: str
    """Its state."""
    priority: int
    """Claim priority (higher first)."""
    attempt: int
    """Failures the job itself caused."""
    max_attempts: int
    """Failures allowed before the job is dead."""
    crashes: int
    """Leases lost to crashed or hung workers."""
    run_at: int
    """Not claimable before this time."""
    lease_id: str | None = None
    """The current lease's fencing token, if running."""
    lease_owner: str | None = None
    """The worker holding the lease."""
    lease_expires_at: int | None = None
    heartbeat_at: int | None = None
    deadline_at: int | None = None
    started_at: int | None = None
    cancel_requested: bool
    """An operator asked a running job to stop at its next heartbeat."""
    stage: str | None = None
    """The stage the current run last reported (`claimed`, `chunking`, `embedding`, ...)."""
    stage_at: int | None = None
    run_at_rule: str
    """Why `run_at` holds its value (`accepted`, `backoff after attempt 2: ...`, ...)."""
    last_error_code: str | None = None
    """Code of the last error."""
    last_error_message: str | None = None
    """Message of the last error."""
    created_at: int
    """When the job was created."""
    changed_at: int
    """When its state last changed."""
    changed_by: str
    """Who made the last change."""
    change_cause: str
    """Why (the cause recorded in history)."""
    generation: str | None = None
    """The projection generation a `project` or `tombstone` job writes (`None`: the active one
    at the time it runs, for jobs queued before any generation existed; graph jobs).
    """


class LinkView(Model):
    """One linked source, bound to the ledger."""

    source_key: str
    """The linked source's key (same dataset)."""
    direction: str
    """`out`: the asked source links to it; `in`: it links to the asked source."""
    via_revision_id: str
    """The revision whose link made the edge (the linking source's current head)."""
    head_revision_id: str
    """The linked source's current head revision, per the ledger."""
    tags: list[str]
    """Its head's tags (present when the graph's `HEAD` agrees with the ledger)."""


class PassDetail(Model):
    """A pass with the drift it confirmed."""

    pass_: VerifyPass = Field(alias="pass")
    """The pass."""
    drift: list[DriftRecord]
    """Its drift, in the order found (only the datasets the token may read)."""


class PassList(Model):
    """Passes, newest first."""

    passes: list[VerifyPass]
    """The passes."""


class PauseBody(Model):
    """The body of a pause or resume."""

    dataset: str | None = None
    """Dataset name: 1-128 characters, no `/`, no control characters, no surrounding
    whitespace.
    """
    reason: str | None = None
    """Why (recorded in history); at most 500 printable characters."""


class Period(Model):
    """A half-open period `[from, to)`; `to == OPEN` is open-ended."""

    from_: int = Field(alias="from")
    """The first instant it covers."""
    to: int
    """The first instant it no longer covers ([`OPEN`]: never ends)."""


class Phases(Model):
    """Milliseconds spent per phase (absent: the phase did not run)."""

    admission: float | None = None
    """Waiting in the admission queue for a slot (absent when one was free)."""
    embed: float | None = None
    """Embedding the query."""
    vector: float | None = None
    """The store's nearest-neighbour search."""
    bind: float | None = None
    """Ledger checks of hits."""
    lexical: float | None = None
    """The lexical query."""
    fuse: float | None = None
    """Fusion, grouping and the final check."""


class Principal(Model):
    """What a verified token may do."""

    token_id: str
    """The token's id."""
    name: str
    """The token's name, used as the actor in history (`token:<name>`)."""
    scopes: list[str]
    """Granted scopes."""
    datasets: list[str] | None = None
    """Datasets the token may touch; `None` means all."""
    identity: Identity | None = None


class ProjectionReceipt(Model):
    """One backend's projection receipt."""

    backend: str
    """The backend."""
    state: str
    """Its state."""
    evidence: Any = None
    """Read-back evidence (JSON), once verified."""
    updated_at: int
    """Last change."""


class Rectangle(Model):
    """A revision holding over `valid` while cairn believed it, during `[recorded_from,
    recorded_to)`.
    """

    id: str
    """Its id."""
    assertion_id: str
    """The assertion that made it."""
    revision_id: str
    """The revision that held (a tombstone: the source did not exist)."""
    valid: Period
    """When it held."""
    recorded_from: int
    """When cairn started to believe it."""
    recorded_to: int
    """When cairn stopped believing it ([`OPEN`]: it still does)."""


class ReplayBody(Model):
    """`POST /v1/webhooks/{id}/replay`'s body."""

    from_: int = Field(alias="from")
    """The first event to deliver again."""
    reason: str | None = None
    """Why (recorded in history)."""


class RequeueBody(Model):
    """The RequeueBody schema."""

    states: list[str] | None = None
    """States to act on (default: every state the action applies to)."""
    dataset: str | None = None
    """Dataset name: 1-128 characters, no `/`, no control characters, no surrounding
    whitespace.
    """
    error_code: str | None = None
    """Only jobs whose last error has this code."""
    q: str | None = None
    """Source key text, or a job or revision id."""
    dry_run: bool | None = None
    """Only list the candidates; change nothing (default false)."""
    reason: str | None = None
    """Why (recorded in history); at most 500 printable characters."""


class RetireGeneration(Model):
    """`POST /v1/ops/generations/{id}/retire`."""

    reason: str | None = None
    """Why (history)."""


class Revision(Model):
    """A revision as stored."""

    id: str
    """Revision id (UUID v5 of its identity, or v7 for tombstones)."""
    dataset: str
    """Dataset."""
    source_key: str
    """Source key."""
    content_sha256: str | None = None
    """SHA-256 of the content; `None` for a tombstone."""
    byte_length: int
    """Byte length of the content."""
    media_type: str
    """Media type."""
    tags: list[str]
    """Tags."""
    metadata: Any
    """Metadata object."""
    tombstone: bool
    """Whether this revision deletes the source."""
    previous_revision_id: str | None = None
    """The head this revision replaced when it was first accepted."""
    actor: str
    """Who submitted it."""
    reason: str | None = None
    """Why (tombstones)."""
    accepted_at: int
    """When it was first accepted."""


class RevisionDetail(Model):
    """A revision with its latest job, that job's receipts and the revision's history."""

    revision: Revision
    """The revision."""
    is_head: bool
    """Whether it is the current head of its source."""
    job: Job | None = None
    receipts: list[ProjectionReceipt]
    """That job's receipts per backend."""
    history: list[HistoryEntry]
    """Every transition that touched this revision, its jobs or receipts, oldest first."""


class RevokeBody(Model):
    """A revocation."""

    reason: str | None = None
    """Why (recorded in history); at most 500 printable characters."""


class SearchBody(Model):
    """The request body."""

    query: str
    """1 to 2,000 characters, not only whitespace."""
    datasets: list[str] | None = None
    top_k: int | None = None
    """1 to 100 (default 10)."""
    budget_ms: int | None = None
    """50 to the server's maximum, `search.max_budget_ms` (default 2,000)."""
    mode: str | None = None
    """`auto` (default), `vector` or `lexical`."""
    group_by_source: bool | None = None
    """One result per source (default true)."""
    expand: str | None = None
    """`links`: add each result's linked current sources (needs a graph store)."""
    valid_at: int | str | None = None
    as_of: int | str | None = None
    filter: dict[str, Any]
    """Only sources whose revision matches (the current one, or the one held at `valid_at`): a
    group `{"must": [...], "should": [...], "must_not": [...]}` or a condition `{"field":
    ..., <operator>: ...}`. Fields and operators: `tags` (`any`, `all`, `none`: lists of
    strings), `media_type` (`eq`, `in`), `source_key` (`eq`, `in`, `prefix`, `glob` with `*`
    and `?`), `accepted_at` (`gt`, `gte`, `lt`, `lte`: RFC 3339 or epoch microseconds),
    `metadata.<name>` (`eq`, `in`: strings, numbers, booleans; `exists`; `gt`, `gte`, `lt`,
    `lte`: numbers). Connectors set `metadata.path`, `metadata.commit`, `metadata.author`
    and `metadata.commit_time` (epoch seconds).
    """
    facets: list[str] | None = None
    """Fields to count over every source the datasets and the filter select (not the page):
    `tags`, `media_type`, `metadata.<name>`; at most 8.
    """
    facet_values: int | None = None
    """Values listed per facet, most frequent first: 1 to 100 (default 20)."""


class SearchResponse(Model):
    """An answer."""

    results: list[SearchResult]
    """Best first."""
    mode: str
    """Which phases answered."""
    degraded: bool
    """Whether the answer is less complete than asked."""
    degradations: list[str]
    """Why: `vector_timeout`, `vector_error`, `embed_error`, `lexical_timeout`,
    `lexical_error`, `stale_dropped`, `facets_partial`.
    """
    stale_dropped: int
    """Hits removed because their revision was no longer current (or not yet searchable)."""
    took_ms: float
    """Time from admission to answer."""
    phases: Phases
    """Time per phase."""
    budget_ms: int
    """The budget the request ran under."""
    generation: str | None = None
    """The projection generation the query searched (the one active when it started); `None`
    without a vector store or before any generation exists.
    """
    valid_at: int | None = None
    as_of: int | None = None
    history_partial: bool | None = None
    """For a search at a point in time: whether some revision that held then cannot be returned
    by the phases that answered (it has no vectors in the generation searched, or no
    passages). Absent for the default search, whose current revisions are all indexed.
    """
    history_gaps: list[str] | None = None
    """Which indexes miss some of that history: `vector`, `lexical`."""
    facets: list[FacetCounts] | None = None
    """The facet counts asked for, in the order asked: exact, over every source the datasets
    and the filter select (not the page).
    """
    facets_partial: list[str] | None = None
    """Facets asked for but left out: their count could not finish within the budget (never a
    count of part of the set).
    """
    filter_unindexed: list[str] | None = None
    """Metadata fields the filter names that the vector store holds no payload index for
    (`metadata.<name>`): the answer is as exact, found more slowly. Declare a field in
    `datasets.<d>.filterable` to index it.
    """


class SearchResult(Model):
    """One result."""

    rank: int
    """1-based."""
    dataset: str
    """Dataset of the source."""
    source_key: str
    """Source key."""
    source_revision_id: str
    """The revision the text comes from (the source's head at answer time)."""
    chunk_index: int | None = None
    """The vector chunk the text is (when the result's text is a chunk)."""
    passage_index: int | None = None
    """The lexical passage the text is (when it is a passage)."""
    text: str
    """The chunk's or passage's text."""
    section: str | None = None
    """The section the chunk starts in (`# A > ## B`), when its document has headings."""
    page: int | None = None
    """The chunk's first page, when its document has pages."""
    score: float
    """The score, of the kind in `score_kind`."""
    score_kind: str
    """`rrf`, `cosine` or `bm25`."""
    retrieval: list[str]
    """Phases that found it (`vector`, `lexical`)."""
    projection_state: str
    """`searchable` (vector-searchable) or `pending` (accepted, not yet projected)."""
    accepted_at: int
    """When the revision was accepted (microseconds since the Unix epoch)."""
    accepted_by: str
    """Who submitted it (`token:<name>`)."""
    valid_from: int | None = None
    valid_to: int | None = None
    links: list[LinkView] | None = None
    """With `"expand": "links"`: the current sources this result's source links to (bound to
    the ledger like every result).
    """


class SourceAccess(Model):
    """A source's readers on the wire (`access` on a put, the body of an access change)."""

    readers: list[str]
    """Who may read the source: `user:<name>`, `service:<name>` or `group:<name>`. An empty
    list: nobody but tokens that read their whole datasets.
    """


class SourceListing(Model):
    """A source's head as a listing shows it: enough to compare the dataset with another copy
    (a folder, a repository) without reading any content.
    """

    source_key: str
    """Source key."""
    head_revision_id: str
    """The head revision."""
    content_sha256: str | None = None
    """SHA-256 of the head's bytes; `None` when the head is a tombstone."""
    byte_length: int
    """Byte length of the head's bytes."""
    tombstone: bool
    """Whether the head deletes the source."""
    accepted_at: int
    """When the head was accepted."""
    owner: str | None = None
    """Who keeps the source: `connector:<id>`, or `None` when API ingest created it."""


class SourcePage(Model):
    """A page of a dataset's heads."""

    dataset: str
    prefix: str
    sources: list[SourceListing]
    """By key, in byte order."""
    next_after: str | None = None
    """Pass as `after` for the next page; `null` on the last page."""


class SourceView(Model):
    """A source with its head and revision chain."""

    dataset: str
    """Dataset."""
    source_key: str
    """Source key."""
    head: Revision
    """The current head."""
    deleted: bool
    """Whether the head is a tombstone."""
    revisions: list[Revision]
    """Every revision of the source, newest first."""
    head_history: list[HistoryEntry]
    """Head moves, oldest first."""


class StartBackup(Model):
    """A backup to take."""

    reason: str | None = None
    """Why (kept in the manifest); at most 500 printable characters."""
    portable: bool | None = None
    """Write each generation's vectors as the portable dump (loadable into qdrant-edge or a
    Qdrant server) instead of copying the embedded shard; a Qdrant server's are always
    dumped.
    """


class StartPass(Model):
    """A pass to start."""

    tier: str | None = None
    generation: str | None = None
    """The generation to verify (`g-` and 16 hex digits); the active one when left out."""
    repair: bool | None = None
    """Repair what the pass confirms, through the normal paths."""
    rate: int | None = None
    """This pass's rate limit in points read per second (a store request counts as 100),
    instead of `verify.points_per_second`; a pass resumed after a restart goes back to the
    configured limit.
    """
    reason: str | None = None
    """Why (recorded in history); at most 500 printable characters."""


class SwitchGeneration(Model):
    """`POST /v1/ops/generations/{id}/switch`."""

    force: bool | None = None
    """Switch even though some current heads are not verified in it (they are named)."""
    reason: str | None = None
    """Why (history)."""


class SyncFile(Model):
    """What happened to one file that a run did not keep in step."""

    path: str
    """The path inside the folder or tree."""
    outcome: str
    """`skipped`, `failed` or `conflict`."""
    code: str
    """A stable code (`too_large`, `owned_by_another`, `secret_detected`, ...)."""
    detail: str
    """The detail."""


class SyncReport(Model):
    """The report of one run, written as the run goes and complete at its end."""

    location: str
    """Where the run read (a folder's path, or `repository@commit`)."""
    commit: str | None = None
    """The commit a git run read."""
    stage: str
    """The step it reached: `listing`, `submitting`, `tombstoning`, `done`."""
    added: int
    """New files accepted."""
    changed: int
    """Changed files accepted."""
    unchanged: int
    """Files whose bytes the dataset already held."""
    removed: int
    """Sources tombstoned because their file is gone."""
    skipped: int
    """Files left out (format, size, name, links, globs)."""
    failed: int
    """Files refused by acceptance (bad content, a credential, ...)."""
    conflicts: int
    """Files whose key another owner holds: never overwritten."""
    hashed: int
    """Files read and hashed (the rest matched the index by fingerprint)."""
    trees_read: int | None = None
    """Git trees read (a subtree whose id the last run recorded is not)."""
    access_changed: int | None = None
    """Sources whose readers the run changed (counted apart from content changes: an access
    change is no new revision).
    """
    fetched_bytes: int | None = None
    """A remote repository's fetch: bytes it wrote to the mirror (0 when nothing changed)."""
    fetch_ms: int | None = None
    """How long the fetch took, in milliseconds (0 for a local repository or a folder)."""
    files: list[SyncFile]
    """Up to [`MAX_REPORTED_FILES`] files skipped, failed or in conflict."""
    files_omitted: int
    """Files beyond the cap that `files` leaves out."""
    elapsed_ms: int
    """How long the run took, in milliseconds (at its last report)."""


class SyncRun(Model):
    """One run of a connector: its job and its report."""

    job: Job
    """The `sync` job."""
    report: SyncReport | None = None


class Timeline(Model):
    """A source's validity as the ledger holds it: every assertion in ledger order and every
    rectangle, believed or not.
    """

    assertions: list[Assertion]
    """The assertions, in the source's own order."""
    rectangles: list[Rectangle]
    """The rectangles, by record start then valid start."""
    tombstones: list[str]
    """Which of the revisions named are tombstones (the source did not exist there)."""


class TokenAnswer(Model):
    """A token change's answer: the token, and its new secret when one was made."""

    token: TokenInfo
    secret: str | None = None
    """The new secret, shown once (creation and rotation)."""
    note: str | None = None
    """A reminder that the secret is not shown again."""


class TokenInfo(Model):
    """A token as listed: everything but its secret, which is never stored."""

    id: str
    """Id."""
    name: str
    """Name (the actor `token:<name>`)."""
    scopes: list[str]
    """Scopes."""
    datasets: list[str] | None = None
    """Dataset allowlist (`None`: all datasets)."""
    identity: Identity | None = None
    created_by: str
    """Who created it."""
    created_at: int
    """When."""
    expires_at: int | None = None
    revoked_at: int | None = None
    revoked_by: str | None = None
    """Who revoked it."""
    replaced_by: str | None = None
    """The token that replaced it in a rotation."""
    state: str
    """Active, expired or revoked, at the time it was read."""


class TokenList(Model):
    """Every token."""

    tokens: list[TokenInfo]


class VerifyPass(Model):
    """A verify pass: one tier over every bucket of one generation, resumable at its cursor."""

    id: str
    """Its id."""
    tier: str
    """How deep it reads."""
    generation: str
    """The generation it checks."""
    repair: bool
    """Whether it repairs what it confirms."""
    state: str
    """Where it stands."""
    cursor: int
    """The next bucket to check."""
    buckets_checked: int
    """Buckets checked so far."""
    skipped: int
    """Sources skipped because work was in flight for them."""
    drift: dict[str, Any]
    """Confirmed drift so far, by kind."""
    created_by: str
    """Who started it."""
    reason: str
    """Why."""
    started_at: int
    """When it started (epoch microseconds)."""
    changed_by: str
    """Who changed it last, and why."""
    change_cause: str
    """The last change's cause."""
    changed_at: int
    """When it changed last."""


SCHEMAS = [
    "Acceptance",
    "AccessRecord",
    "AccessRequest",
    "ActionBody",
    "AddField",
    "Assertion",
    "BackupList",
    "BackupView",
    "BatchRequest",
    "BatchResponse",
    "BlockRequest",
    "CancelBody",
    "ChangeBody",
    "Connector",
    "ConnectorAccess",
    "ConnectorChanged",
    "ConnectorList",
    "ConnectorSummary",
    "ConnectorView",
    "ContentBlock",
    "CreateBody",
    "CreateGeneration",
    "DatasetAccess",
    "DefaultRequest",
    "DeliveriesBody",
    "DriftRecord",
    "Error",
    "FacetAnswer",
    "FacetCount",
    "FacetCounts",
    "FilterableList",
    "GenerationFields",
    "GraphSources",
    "HistoryEntry",
    "HookAnswer",
    "Identity",
    "Job",
    "LinkView",
    "PassDetail",
    "PassList",
    "PauseBody",
    "Period",
    "Phases",
    "Principal",
    "ProjectionReceipt",
    "Rectangle",
    "ReplayBody",
    "RequeueBody",
    "RetireGeneration",
    "Revision",
    "RevisionDetail",
    "RevokeBody",
    "SearchBody",
    "SearchResponse",
    "SearchResult",
    "SourceAccess",
    "SourceListing",
    "SourcePage",
    "SourceView",
    "StartBackup",
    "StartPass",
    "SwitchGeneration",
    "SyncFile",
    "SyncReport",
    "SyncRun",
    "Timeline",
    "TokenAnswer",
    "TokenInfo",
    "TokenList",
    "VerifyPass",
]
"""The document's schemas that have a model here."""
