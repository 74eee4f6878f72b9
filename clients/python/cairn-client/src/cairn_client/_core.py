"""What the sync and the async client share: calls as data, retries, auth, and waits.

Each operation is built once as a :class:`Call` (method, path, query, body, and how to read
the answer). The longer helpers (following a receipt, a batch in chunks) are written once as
generators that yield :class:`Call` and :class:`Sleep` steps and receive their results; the
sync client drives them with blocking I/O, the async client with ``await``. So the two clients
cannot drift apart in what they send or how they wait.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from .errors import (
    CairnError,
    GoneError,
    NotFoundError,
    PermissionDeniedError,
    ProjectionFailed,
    RevisionSuperseded,
    TransportError,
    WaitTimeout,
    error_from_response,
)

T = TypeVar("T")

Params = Mapping[str, "str | int | bool | None"]

#: Request headers every call sends.
USER_AGENT = "cairn-client-python/0.1.0"


@dataclass(frozen=True)
class Call(Generic[T]):
    """One HTTP exchange: what to send, and how to read a successful answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: Params | None = None
    body: Any = None
    #: Whether a broken connection may be retried (it may have reached the server).
    idempotent: bool = False


@dataclass(frozen=True)
class Sleep:
    """A pause in a wait, in seconds."""

    seconds: float


@dataclass(frozen=True)
class Retry:
    """How a call answered 429 or 503 (or, if idempotent, cut off) is retried.

    Retries stop at ``attempts`` tries in all, or when the next pause would take the time
    spent waiting past ``budget`` seconds. A pause honours ``Retry-After``; without one it is
    exponential from ``base`` to ``cap`` with full jitter. ``Retry(attempts=1)`` never retries.
    """

    budget: float = 30.0
    attempts: int = 5
    base: float = 0.25
    cap: float = 8.0
    statuses: frozenset[int] = field(default_factory=lambda: frozenset({429, 503}))

    def pause(
        self, attempt: int, error: CairnError, waited: float, idempotent: bool
    ) -> float | None:
        """The pause before try ``attempt + 1`` after ``error``, or ``None`` to give up."""
        if attempt >= self.attempts:
            return None
        if isinstance(error, TransportError):
            if not idempotent:
                return None
        elif error.status not in self.statuses:
            return None
        if error.retry_after is not None:
            pause = error.retry_after
        else:
            pause = random.uniform(0, min(self.cap, self.base * 2 ** (attempt - 1)))
        if waited + pause > self.budget:
            return None
        return pause


#: Called before each retry with the error that caused it and the pause about to be taken.
RetryHook = Callable[[CairnError, float], None]

#: Answers a bearer token for each request (an OAuth access token that it refreshes itself,
#: for instance).
TokenProvider = Callable[[], str]


def bearer(token: str | None, provider: TokenProvider | None) -> str | None:
    """The token to send: the argument, else the provider's, else ``CAIRN_TOKEN``."""
    if token is not None:
        return token
    if provider is not None:
        return provider()
    return os.environ.get("CAIRN_TOKEN")


def headers(token: str | None) -> dict[str, str]:
    """The headers of one request."""
    sent = {"user-agent": USER_AGENT, "accept": "application/json"}
    if token:
        sent["authorization"] = f"Bearer {token}"
    return sent


def query(params: Params | None) -> dict[str, str | int]:
    """The query string's pairs, without the ones left out (``None``); booleans as words."""
    pairs: dict[str, str | int] = {}
    for name, value in (params or {}).items():
        if value is None:
            continue
        pairs[name] = ("true" if value else "false") if isinstance(value, bool) else value
    return pairs


def outcome(call: Call[T], response: httpx.Response) -> T:
    """The call's value from a successful answer; raises the typed error of any other."""
    if response.is_success:
        return call.parse(response)
    raise error_from_response(
        response.status_code, response.content, response.headers.get("retry-after")
    )


def transport_error(error: httpx.HTTPError) -> TransportError:
    """A connection-level failure as cairn's error type (no server detail to carry)."""
    return TransportError("transport", f"{type(error).__name__}: {error}")


# -- following receipts --------------------------------------------------------------------

#: Event types that can settle a wait.
SETTLING_EVENTS = "receipt.verified,receipt.failed,job.dead,source.superseded,source.tombstoned"

#: The longest long poll of the change feed one step asks for (the server allows 30 s).
FEED_WAIT_MS = 20_000

#: What a wait may wait for.
WAITS = ("accepted", "verified")

_VERIFIED = {"verified", "excluded"}
_FAILED_JOB = {"dead", "cancelled", "quarantined"}


def settled(detail: Mapping[str, Any]) -> bool:
    """Whether a revision's projection is over: ``True`` when every store verified it.

    Raises :class:`RevisionSuperseded` or :class:`ProjectionFailed` when it ended otherwise;
    ``False`` while it goes on (pending, running, retrying).
    """
    revision = detail.get("revision") or {}
    job = detail.get("job") or {}
    receipts = detail.get("receipts") or []
    revision_id = str(revision.get("id", ""))
    states = {str(receipt.get("state")) for receipt in receipts}
    job_state = str(job.get("state", ""))
    if job_state == "superseded" or "superseded" in states:
        raise RevisionSuperseded(
            "superseded",
            f"revision {revision_id} was superseded before every store verified it",
            details={"revision_id": revision_id},
        )
    if job_state in _FAILED_JOB or "failed" in states:
        code = job.get("last_error_code") or f"job_{job_state or 'failed'}"
        message = job.get("last_error_message") or "a store's receipt failed"
        raise ProjectionFailed(
            str(code),
            f"revision {revision_id}: {message}",
            details={"revision_id": revision_id, "job_state": job_state},
        )
    return bool(receipts) and job_state == "completed" and states <= _VERIFIED


def follow(
    revisions: Sequence[str],
    dataset: str | None,
    cursor: int | None,
    timeout: float,
    revision_call: Callable[[str], Call[Any]],
    changes_call: Callable[[int, str | None, int], Call[Any]],
) -> Generator[Call[Any] | Sleep, Any, dict[str, CairnError | None]]:
    """Waits until each revision is verified in every store, or ended otherwise.

    Answers, per revision, ``None`` (verified) or the error that ended it
    (:class:`RevisionSuperseded`, :class:`ProjectionFailed`). Raises :class:`WaitTimeout`
    when ``timeout`` seconds pass first. With a feed ``cursor`` taken before the revisions
    were accepted, it sleeps in the change feed's long poll and reads a revision again only
    when an event names it; without one (or when the feed is refused) it polls with backoff.
    """
    deadline = time.monotonic() + timeout
    open_ids = list(dict.fromkeys(revisions))
    ended: dict[str, CairnError | None] = {}
    due = set(open_ids)
    pause = 0.05
    while True:
        for revision in [r for r in open_ids if r in due]:
            detail = yield revision_call(revision)
            try:
                if settled(detail):
                    ended[revision] = None
            except (RevisionSuperseded, ProjectionFailed) as error:
                ended[revision] = error
        open_ids = [r for r in open_ids if r not in ended]
        if not open_ids:
            return ended
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WaitTimeout(
                "wait_timeout",
                f"{len(open_ids)} revision(s) not yet verified after {timeout:g} s; they are "
                "accepted and projection goes on",
                details={"revisions": open_ids},
            )
        if cursor is not None:
            try:
                page = yield changes_call(cursor, dataset, int(min(remaining * 1000, FEED_WAIT_MS)))
            except (NotFoundError, PermissionDeniedError, GoneError):
                cursor = None
                due = set(open_ids)
                continue
            cursor = int(page.get("next_after", cursor))
            named = {str(event.get("revision_id")) for event in page.get("events", [])}
            events = page.get("events", [])
            # A page that names none of them still ends with one look, so that a wait never
            # rests on the feed alone.
            due = {r for r in open_ids if r in named} if events else set(open_ids)
        else:
            yield Sleep(min(pause, remaining))
            pause = min(pause * 2, 2.0)
            due = set(open_ids)


def chunks(
    items: Sequence[T], size: int, max_bytes: int, weigh: Callable[[T], int]
) -> list[list[T]]:
    """``items`` in order, cut into chunks of at most ``size`` items and about ``max_bytes``."""
    out: list[list[T]] = []
    current: list[T] = []
    weight = 0
    for item in items:
        cost = weigh(item)
        if current and (len(current) >= size or weight + cost > max_bytes):
            out.append(current)
            current, weight = [], 0
        current.append(item)
        weight += cost
    if current:
        out.append(current)
    return out
