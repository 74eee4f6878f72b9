"""The LangChain retriever inside a small LCEL chain, with langchain-core's own fake chat
model that repeats its prompt (ParrotFakeChatModel): the chain gets the current revision's
text after an edit, and nothing after a delete."""

from __future__ import annotations

import asyncio

from cairn_client import Client
from langchain_cairn import CairnRetriever
from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import ParrotFakeChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnablePassthrough


def _chain(retriever: CairnRetriever) -> Runnable[str, str]:
    prompt = ChatPromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}")

    def joined(documents: list[Document]) -> str:
        return "\n---\n".join(d.page_content for d in documents)

    return (
        {"context": retriever | joined, "question": RunnablePassthrough()}
        | prompt
        | ParrotFakeChatModel()
        | StrOutputParser()
    )


def test_the_chain_sees_the_current_revision_then_nothing(
    admin: Client, base_url: str, admin_token: str, dataset: str
) -> None:
    retriever = CairnRetriever(
        base_url=base_url, token=admin_token, datasets=[dataset], top_k=3, mode="lexical"
    )
    first = retriever.add_source("lark.md", "the skylark sings above the barley field in June")
    chain = _chain(retriever)
    assert "barley field" in chain.invoke("where does the skylark sing")

    second = retriever.add_source("lark.md", "the skylark sings above the oat stubble in August")
    said = chain.invoke("where does the skylark sing")
    assert "oat stubble" in said and "barley" not in said, said

    documents = retriever.invoke("where does the skylark sing")
    (document,) = documents
    meta = document.metadata
    assert meta["dataset"] == dataset and meta["source_key"] == "lark.md"
    assert meta["revision_id"] == str(second.source_revision_id) != str(first.source_revision_id)
    assert meta["trust"] == "untrusted"
    assert meta["retrieval"] == ["lexical"] and meta["score"] > 0
    assert "passage_index" in meta or "chunk_index" in meta

    # The async path, through the vector phase too.
    vector = CairnRetriever(base_url=base_url, token=admin_token, datasets=[dataset], mode="vector")
    found = asyncio.run(vector.ainvoke("skylark singing over a field"))
    assert [d.metadata["revision_id"] for d in found] == [str(second.source_revision_id)]

    retriever.delete_source("lark.md", reason="test")
    said = chain.invoke("where does the skylark sing")
    assert "skylark sings" not in said, said
    assert retriever.invoke("where does the skylark sing") == []
    assert asyncio.run(vector.ainvoke("skylark singing over a field")) == []


def test_documents_are_added_by_key(
    admin: Client, base_url: str, admin_token: str, dataset: str
) -> None:
    retriever = CairnRetriever(
        base_url=base_url, token=admin_token, dataset=dataset, mode="lexical"
    )
    receipts = retriever.add_documents(
        [
            Document(
                page_content="the dipper walks under the water",
                metadata={"source_key": "d.md", "tag": "x"},
            ),
            Document(page_content="the grebe dives for minnows", id="g.md"),
        ]
    )
    assert [r.source_key for r in receipts] == ["d.md", "g.md"]
    hit = retriever.invoke("dipper under water")[0]
    assert hit.metadata["source_key"] == "d.md"
    assert admin.revision(hit.metadata["revision_id"]).revision.metadata == {"tag": "x"}
