"""LlamaIndex's retriever over cairn: current revisions only, each with its provenance.

from llama_index.retrievers.cairn import CairnRetriever
retriever = CairnRetriever(base_url="http://127.0.0.1:8080", datasets=["docs"], top_k=5)
nodes = retriever.retrieve("how do futures run")
"""

from llama_index.retrievers.cairn.base import CairnRetriever

__all__ = ["CairnRetriever"]
