"""LLMStep: the base of the query-time LLM steps (filter, NER, reader): a backend it may own
and close, and an optional reply cache."""

from __future__ import annotations

from pathlib import Path

from hippo_gpu.llm.backends import Backend, make_backend
from hippo_gpu.llm.cache import LLMCache, open_cache


class LLMStep:
    """Holds `backend` (owned, and closed by `close()`, when built here from a spec string) and
    an optional `cache`. Usable as a context manager."""

    def __init__(self, backend: Backend | str, cache: LLMCache | str | Path | None) -> None:
        self._owns_backend = not isinstance(backend, Backend)
        self.backend = make_backend(backend)
        self.cache = open_cache(cache)

    def close(self) -> None:
        if self._owns_backend:
            self.backend.close()

    def __enter__(self) -> LLMStep:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
