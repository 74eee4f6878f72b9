"""The LlamaIndex retriever through a RetrieverQueryEngine with llama-index-core's MockLLM
(which answers with its prompt): the engine gets the current revision's text after an edit,
and nothing after a delete."""

from __future__ import annotations

import asyncio

from cairn_client import Client
from llama_index.core.llms import MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.retrievers.cairn import CairnRetriever


def test_the_engine_sees_the_current_revision_then_nothing(
    admin: Client, base_url: str, admin_token: str, dataset: str
) -> None:
    retriever = CairnRetriever(base_url, admin_token, datasets=[dataset], top_k=3)
    engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM())

    first = admin.ingest(dataset, "owl.md", "the barn owl hunts voles along the hedgerow")
    response = engine.query("what does the barn owl hunt")
    assert "voles" in str(response)
    second = admin.ingest(dataset, "owl.md", "the barn owl hunts shrews along the ditch")
    response = engine.query("what does the barn owl hunt")
    assert "shrews" in str(response) and "voles" not in str(response), str(response)
    (node,) = response.source_nodes
    meta = node.node.metadata
    assert meta["revision_id"] == str(second.source_revision_id) != str(first.source_revision_id)
    assert meta["source_key"] == "owl.md" and meta["dataset"] == dataset
    assert meta["trust"] == "untrusted" and node.score is not None

    nodes = asyncio.run(retriever.aretrieve("barn owl hunting"))
    assert [n.node.metadata["revision_id"] for n in nodes] == [str(second.source_revision_id)]

    admin.delete_source(dataset, "owl.md", reason="test")
    response = engine.query("what does the barn owl hunt")
    assert response.source_nodes == []
    assert "shrews" not in str(response)
