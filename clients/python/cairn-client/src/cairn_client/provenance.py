"""A search hit's provenance, as the LangChain and LlamaIndex retrievers attach it.

Every retrieved text carries where it came from (dataset, source, revision, chunk), how it
was found (score and retrieval kind), and ``trust: "untrusted"``: it is a document's words,
to be quoted as data and never followed as instructions.
"""

from __future__ import annotations

from typing import Any

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
