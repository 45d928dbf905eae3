"""Retrievers for LLM frameworks, over a local `Searcher` or a `hippo-gpu serve` URL.

    hippo_gpu.integrations.langchain.HippoRetriever   langchain-core BaseRetriever
    hippo_gpu.integrations.llamaindex.HippoRetriever  llama-index-core BaseRetriever

Both wrap `PassageClient` (client.py), which answers a list of queries with one batched retrieval:
`Searcher.retrieve` in-process, or POST /v1/retrieve over HTTP. The frameworks are optional
dependencies (extras `langchain`, `llamaindex`); each adapter module imports its framework, this
package does not. Nothing in the core imports this package.
"""

from hippo_gpu.integrations.client import Passage, PassageClient, RemoteRetrievalError

__all__ = ["Passage", "PassageClient", "RemoteRetrievalError"]
