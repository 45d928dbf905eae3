"""Serving: server.py (HTTP: validate -> service) and mcp.py (MCP tools -> service) over
service.py (named indexes, one micro-batcher each), batcher.py (micro-batching), metrics.py
(Prometheus) and writes.py (index writes).

No retrieval logic lives here: a batch of queries goes to one `Searcher.retrieve` call.
"""
