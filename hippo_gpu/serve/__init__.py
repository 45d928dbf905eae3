"""Serving: server.py (HTTP: validate -> micro-batch -> Searcher) over batcher.py (micro-batching).

No retrieval logic lives here: a batch of queries goes to one `Searcher.retrieve` call.
"""
