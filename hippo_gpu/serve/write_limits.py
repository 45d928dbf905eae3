"""WriteLimits: what the write routes (serve/writes.py) enforce. Its own module, below
serve/writes.py in the serving layers, so the routes and ServerConfig (serve/config.py, which
re-exports it) both read it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["WriteLimits"]


@dataclass(frozen=True)
class WriteLimits:
    """Limits of POST / DELETE /v1/passages. The per-request counts and characters are in the
    write routes' schema (violations -> 422); the body size (-> 413) and the rate (-> 429, with
    Retry-After) are checked before the body is read.

    Attributes:
        max_passages_per_request: most passages one insert carries.
        max_title_chars, max_text_chars: most characters in a passage's title, its body.
        max_triples_per_passage, max_entities_per_passage: most triples, entities posted with
            one passage.
        max_keys_per_request: most keys one delete names.
        max_body_bytes: largest write request body (the query routes have their own, derived
            from the query limits).
        writes_per_second: sustained write requests per second, all clients together (every
            write commits a version: a client in a loop would otherwise fill the disk).
        write_burst: write requests accepted at once above that rate.
    """

    max_passages_per_request: int = 10_000
    max_title_chars: int = 1_000
    max_text_chars: int = 100_000
    max_triples_per_passage: int = 1_000
    max_entities_per_passage: int = 1_000
    max_keys_per_request: int = 100_000
    max_body_bytes: int = 32 * 2**20
    writes_per_second: float = 10.0
    write_burst: int = 20

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name != "writes_per_second" and value < 1:
                raise ValueError(f"{f.name} must be >= 1, got {value}")
        if not self.writes_per_second > 0:
            raise ValueError(f"writes_per_second must be > 0, got {self.writes_per_second}")
