"""Ray back ends: `hippo-gpu retrieve --ray`, `hippo-gpu extract --ray`, `hippo-gpu serve --ray`.

    ray_batch.py    retrieve_ray: a query file cut into chunks, an actor pool (each actor loads
                    the index once) answers and commits each chunk as a Parquet part, the parts
                    are joined into OUT; a rerun after a crash answers only the missing chunks
    ray_extract.py  extract_openie_ray: passages sharded over Ray tasks, round-robin over several
                    LLM endpoints; the driver owns the content-addressed cache
    ray_serve.py    serve_until_signal / deploy of a ServeOptions: the HTTP server
                    (hippo_gpu.serve.server's app, micro-batcher included) replicated on Ray
                    Serve, the index loaded once per replica

Ray is optional (the `[ray]` extra) and is imported only inside this package; nothing in the core
imports this package. The names below load their module (and so Ray) on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hippo_gpu.distributed.ray_batch import retrieve_ray
    from hippo_gpu.distributed.ray_extract import extract_openie_ray

__all__ = ["extract_openie_ray", "retrieve_ray"]


def __getattr__(name: str) -> Any:
    if name == "retrieve_ray":
        from hippo_gpu.distributed.ray_batch import retrieve_ray

        return retrieve_ray
    if name == "extract_openie_ray":
        from hippo_gpu.distributed.ray_extract import extract_openie_ray

        return extract_openie_ray
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
