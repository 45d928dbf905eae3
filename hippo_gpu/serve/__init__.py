"""Serving: server.py (HTTP app: routes -> service) and mcp.py (MCP tools -> service) over
schema.py (the HTTP contract as pydantic models), guards.py (413 body limit, 401 bearer token),
service.py (named indexes, one micro-batcher each), config.py (QueryLimits, ServerConfig),
batcher.py (micro-batching), metrics.py (Prometheus) and writes.py (index writes).

No retrieval logic lives here: a batch of queries goes to one `Searcher.retrieve` call.
"""
