"""The client's models: those the OpenAPI document defines, and the few it leaves untyped.

Most models are generated from the document `cairn serve` serves (:mod:`._generated`), and
the tests fail when they drift. The change feed, webhooks and the batch answer are plain
objects in the document (``body = Object``), so their models are written here; a test fails
when the document starts to type them, so that they are generated from then on.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ._generated import (
    Acceptance,
    AccessRecord,
    FacetAnswer,
    FacetCount,
    FacetCounts,
    Model,
    Revision,
    RevisionDetail,
    SearchResponse,
    SearchResult,
    SourceListing,
    SourcePage,
    SourceView,
    TokenInfo,
)

#: A receipt: the answer to a put or a delete. ``status`` is ``queued_not_confirmed`` (the
#: bytes are on disk; projection follows) or ``duplicate``; it never means indexed.
Receipt = Acceptance

#: A search's answer: results bound to each source's current revision, and what degraded.
SearchAnswer = SearchResponse


class Event(Model):
    """One event of the change feed (and a webhook delivery's body): never content."""

    seq: int
    """Its number in the outbox: commit order."""
    id: str
    """``evt_<seq>``, the same in every delivery of it: deduplicate by it."""
    type: str
    """``receipt.verified``, ``source.superseded``, ... (docs/api.md, "Changes")."""
    at: int
    """When it happened, epoch microseconds."""
    dataset: str | None = None
    """Its dataset, when it is about a source."""
    source_key: str | None = None
    """Its source, when it is about one."""
    revision_id: str | None = None
    """Its revision, when it is about one."""
    data: dict[str, Any] = Field(default_factory=dict)
    """The type's fields (``backend``, ``job_id``, ``superseded_by``, ...)."""


class ChangePage(Model):
    """A page of the change feed, and where to read from next."""

    version: int
    """The events' shape version (1)."""
    events: list[Event]
    """In sequence order."""
    next_after: int
    """Pass it as ``after`` next time: a consumer that keeps it misses nothing."""
    pruned_through: int
    """Retention removed every event up to this number."""


class Webhook(Model):
    """A webhook subscription (never its secret)."""

    id: str
    """Its id."""
    url: str
    """Where deliveries go."""
    events: list[str]
    """Event types it hears."""
    datasets: list[str] | None = None
    """Datasets it hears (``None``: every dataset its creator could read)."""
    description: str = ""
    """What it is for."""
    state: str
    """``active``, ``paused``, ``disabled`` or ``deleted``."""
    disabled_reason: str | None = None
    """Why it was disabled (a 410 from the receiver), when it was."""
    previous_secret_until: int | None = None
    """Until when the secret before a rotation still signs, epoch microseconds."""
    cursor: int = 0
    """The last outbox event fanned out to it."""
    created_by: str = ""
    """Who created it."""
    created_at: int = 0
    """When, epoch microseconds."""
    changed_by: str = ""
    """Who changed it last."""
    change_cause: str = ""
    """Why."""
    changed_at: int = 0
    """When, epoch microseconds."""


class CreatedWebhook(Model):
    """A new webhook, or one whose secret was rotated, with the secret shown this once."""

    webhook: Webhook
    """The subscription."""
    secret: str
    """``whsec_...``: keep it; cairn never shows it again."""


class WebhookSummary(Model):
    """A webhook in a list, with its deliveries counted."""

    webhook: Webhook
    """The subscription."""
    deliveries: dict[str, Any] = Field(default_factory=dict)
    """Its deliveries by state (``pending``, ``delivered``, ``dead``, ...) and ``behind``."""


class WebhookChanged(Model):
    """A webhook after a change, and how many of its deliveries the change touched."""

    webhook: Webhook
    """The subscription."""
    deliveries: int = 0
    """Deliveries the change moved (retried, discarded, replayed)."""


__all__ = [
    "AccessRecord",
    "ChangePage",
    "CreatedWebhook",
    "Event",
    "FacetAnswer",
    "FacetCount",
    "FacetCounts",
    "Receipt",
    "Revision",
    "RevisionDetail",
    "SearchAnswer",
    "SearchResult",
    "SourceListing",
    "SourcePage",
    "SourceView",
    "TokenInfo",
    "Webhook",
    "WebhookChanged",
    "WebhookSummary",
]
