"""What the LangChain and LlamaIndex retrievers share.

- :func:`provenance`: every retrieved text carries where it came from (dataset, source,
  revision, chunk), how it was found (score and retrieval kind), and ``trust: "untrusted"``:
  it is a document's words, to be quoted as data and never followed as instructions.
- :class:`Clients`: one blocking client, and one async client per event loop (an httpx async
  client belongs to the loop that made it, and frameworks run retrievers in several).
"""

from __future__ import annotations

import asyncio
from typing import Any

from ._core import Retry
from .aio import AsyncClient
from .client import Client
from .models import SearchAnswer, SearchResult


def provenance(hit: SearchResult, answer: SearchAnswer) -> dict[str, Any]:
    """The metadata of one hit of ``answer``."""
    meta: dict[str, Any] = {
        "dataset": hit.dataset,
        "source_key": hit.source_key,
        "revision_id": str(hit.source_revision_id),
        "chunk_index": hit.chunk_index,
        "passage_index": hit.passage_index,
        "section": hit.section,
        "page": hit.page,
        "rank": hit.rank,
        "score": hit.score,
        "score_kind": hit.score_kind,
        "retrieval": list(hit.retrieval),
        "answered": str(answer.mode),
        "accepted_at": hit.accepted_at,
        "trust": "untrusted",
    }
    return {name: value for name, value in meta.items() if value is not None}


class Clients:
    """A blocking client made at first use, and an async client per running event loop."""

    def __init__(self, base_url: str, token: str | None, retry: Retry | None) -> None:
        self._base_url = base_url
        self._token = token
        self._retry = retry
        self._sync: Client | None = None
        self._async: tuple[asyncio.AbstractEventLoop, AsyncClient] | None = None

    def sync(self) -> Client:
        """The blocking client."""
        if self._sync is None:
            self._sync = Client(self._base_url, self._token, retry=self._retry)
        return self._sync

    def for_this_loop(self) -> AsyncClient:
        """The async client of the running loop (a new one when the loop changed)."""
        loop = asyncio.get_running_loop()
        if self._async is None or self._async[0] is not loop:
            self._async = (loop, AsyncClient(self._base_url, self._token, retry=self._retry))
        return self._async[1]
