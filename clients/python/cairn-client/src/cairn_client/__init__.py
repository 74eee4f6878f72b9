"""A Python client for cairn, the durable ingest-and-projection service.

    from cairn_client import Client
    with Client("http://127.0.0.1:8080", token="cairn_...") as cairn:
        cairn.ingest("docs", "intro.md", "# Hello", wait="verified")
        for hit in cairn.search("hello", datasets=["docs"]).results:
            print(hit.source_key, hit.score, hit.text)

:class:`Client` blocks; :class:`AsyncClient` has the same methods to ``await``. Errors are
the classes of :mod:`cairn_client.errors`; models are in :mod:`cairn_client.models`.
"""

from ._core import Retry, TokenProvider
from .aio import AsyncClient
from .client import Client
from .errors import (
    AuthenticationError,
    CairnError,
    ConflictError,
    GoneError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    ProjectionFailed,
    RateLimitedError,
    RevisionSuperseded,
    ServerError,
    TransportError,
    UnavailableError,
    WaitTimeout,
)
from .models import Receipt, SearchAnswer, SearchResult
from .webhooks import WebhookVerificationError, verify_webhook

__all__ = [
    "AsyncClient",
    "AuthenticationError",
    "CairnError",
    "Client",
    "ConflictError",
    "GoneError",
    "InvalidRequestError",
    "NotFoundError",
    "PermissionDeniedError",
    "ProjectionFailed",
    "RateLimitedError",
    "Receipt",
    "Retry",
    "RevisionSuperseded",
    "SearchAnswer",
    "SearchResult",
    "ServerError",
    "TokenProvider",
    "TransportError",
    "UnavailableError",
    "WaitTimeout",
    "WebhookVerificationError",
    "verify_webhook",
]
__version__ = "0.1.0"
