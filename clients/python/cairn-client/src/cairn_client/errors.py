"""cairn's typed errors as Python exceptions.

Every error cairn answers is ``{"code", "message", "details"?}`` with a stable ``code``; the
client raises the exception class of its HTTP status, carrying the code, the message, the
details and ``Retry-After`` when the server sent one. Catch :class:`CairnError` for all of
them, or a subclass for one kind; branch on ``code`` for the exact reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class CairnError(Exception):
    """An error answered by cairn, or met on the way to it."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        details: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}" if status is None else f"{status} {code}: {message}")
        self.code = code
        """The stable code (``not_found``, ``invalid_filter``, ``overloaded``, ...)."""
        self.message = message
        """The server's sentence, for people."""
        self.status = status
        """The HTTP status, when the server answered."""
        self.details: Mapping[str, Any] = details or {}
        """Structured details, when the error has them (``details.field``, ...)."""
        self.retry_after = retry_after
        """Seconds the server asked the client to wait before trying again."""


class InvalidRequestError(CairnError):
    """400, 413, 415 or 422: the request was refused as it is and changed nothing."""


class AuthenticationError(CairnError):
    """401: no token, or one cairn does not accept (unknown, revoked, expired)."""


class PermissionDeniedError(CairnError):
    """403: the token lacks a scope or a dataset the call needs."""


class NotFoundError(CairnError):
    """404: nothing by that name, or nothing the token may read (never told apart)."""


class ConflictError(CairnError):
    """409: the request conflicts with the ledger's state (blocked bytes, own token, ...)."""


class GoneError(CairnError):
    """410: what was asked for was removed (``cursor_expired`` in the change feed)."""


class RateLimitedError(CairnError):
    """429: cairn is busy (``overloaded``); retried within the client's budget first."""


class UnavailableError(CairnError):
    """503: a store or the ledger is unreachable, or the connection cap is reached."""


class ServerError(CairnError):
    """Another 5xx: cairn failed to answer."""


class TransportError(CairnError):
    """cairn could not be reached, or the connection broke (code ``transport``)."""


class WaitTimeout(CairnError):
    """A wait (``ingest(wait="verified")``) ran past its timeout (code ``wait_timeout``).

    The revision is accepted: its bytes are durable, and projection goes on after the wait.
    """


class ProjectionFailed(CairnError):
    """The revision's projection failed for good (a receipt ``failed``, the job ``dead``)."""


class RevisionSuperseded(CairnError):
    """A newer revision of the source became head before this one was verified.

    Not a failure of the ingest: search returns the newer revision, and this one never.
    """


_BY_STATUS: dict[int, type[CairnError]] = {
    400: InvalidRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    410: GoneError,
    413: InvalidRequestError,
    415: InvalidRequestError,
    422: InvalidRequestError,
    429: RateLimitedError,
    503: UnavailableError,
}


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` in seconds, when given as seconds (cairn sends seconds)."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def error_from_response(status: int, body: bytes, retry_after: str | None) -> CairnError:
    """The exception for an error answer: its class by status, its fields from the body."""
    code = f"http_{status}"
    message = "the server answered without cairn's error body"
    details: Mapping[str, Any] | None = None
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        if isinstance(parsed.get("code"), str):
            code = parsed["code"]
        if isinstance(parsed.get("message"), str):
            message = parsed["message"]
        if isinstance(parsed.get("details"), dict):
            details = parsed["details"]
    kind = _BY_STATUS.get(status, ServerError if status >= 500 else CairnError)
    return kind(
        code,
        message,
        status=status,
        details=details,
        retry_after=retry_after_seconds(retry_after),
    )
