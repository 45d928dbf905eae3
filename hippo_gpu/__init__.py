"""hippo_gpu: HippoRAG (v1 and 2) retrieval as batched tensor work on CPU and CUDA.

Public API: `build_index` / `load_index` give an `Index` (data); a `Searcher` answers queries
over it; a `SearcherSpec` opens one from an index directory (device, precisions, threads,
warm-up) as the commands do::

    index = hippo_gpu.load_index("my_index")
    hits = hippo_gpu.Searcher(index).retrieve(["Who founded ...?"], top_k=10)
    searcher = hippo_gpu.SearcherSpec(Path("my_index"), device="cuda", warm_up=True).open()

The names are imported on first use (PEP 562 `__getattr__`), so `import hippo_gpu` and what
needs only a light part of the package (the command line's `--help`, `hippo-gpu stats`, the
config classes) do not pay for torch; `from hippo_gpu import Searcher` works as before.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hippo_gpu.config import __version__

if TYPE_CHECKING:  # what type checkers and IDEs see: the same names, imported eagerly
    from hippo_gpu.config import EncoderConfig, GraphConfig, IndexConfig, RetrievalConfig
    from hippo_gpu.errors import HippoGpuError
    from hippo_gpu.indexing.build import build_index
    from hippo_gpu.indexing.index import Index
    from hippo_gpu.retrieval.explanation import HitExplanation, QueryExplanation
    from hippo_gpu.retrieval.options import SearcherOptions
    from hippo_gpu.retrieval.results import Hit, Ranking
    from hippo_gpu.retrieval.searcher import Searcher
    from hippo_gpu.retrieval.spec import SearcherSpec
    from hippo_gpu.versions.load import load_index
    from hippo_gpu.versions.writer import IndexWriter

# each public name of __all__ (but __version__) -> the module that defines it
_SOURCES = {
    "EncoderConfig": "hippo_gpu.config",
    "GraphConfig": "hippo_gpu.config",
    "HippoGpuError": "hippo_gpu.errors",
    "Hit": "hippo_gpu.retrieval.results",
    "HitExplanation": "hippo_gpu.retrieval.explanation",
    "Index": "hippo_gpu.indexing.index",
    "IndexConfig": "hippo_gpu.config",
    "IndexWriter": "hippo_gpu.versions.writer",
    "QueryExplanation": "hippo_gpu.retrieval.explanation",
    "Ranking": "hippo_gpu.retrieval.results",
    "RetrievalConfig": "hippo_gpu.config",
    "Searcher": "hippo_gpu.retrieval.searcher",
    "SearcherOptions": "hippo_gpu.retrieval.options",
    "SearcherSpec": "hippo_gpu.retrieval.spec",
    "build_index": "hippo_gpu.indexing.build",
    "load_index": "hippo_gpu.versions.load",
}

__all__ = [
    "EncoderConfig",
    "GraphConfig",
    "HippoGpuError",
    "Hit",
    "HitExplanation",
    "Index",
    "IndexConfig",
    "IndexWriter",
    "QueryExplanation",
    "Ranking",
    "RetrievalConfig",
    "Searcher",
    "SearcherOptions",
    "SearcherSpec",
    "__version__",
    "build_index",
    "load_index",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first access and then kept here (so the
    next access is a plain attribute). Any other name is an AttributeError, which is also
    what lets `from hippo_gpu import retrieval` fall through to importing the submodule."""
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(source), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
