"""LangChain's retriever over cairn: current revisions only, each with its provenance.

from langchain_cairn import CairnRetriever
retriever = CairnRetriever(base_url="http://127.0.0.1:8080", datasets=["docs"], top_k=5)
docs = retriever.invoke("how do futures run")
"""

from .retrievers import CairnRetriever

__all__ = ["CairnRetriever"]
