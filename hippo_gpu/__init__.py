"""hippo_gpu: HippoRAG (v1 and 2) retrieval as batched tensor work on CPU and CUDA.

Public API: `build_index` / `load_index` give an `Index` (data); a `Searcher` answers queries
over it; a `SearcherSpec` opens one from an index directory (device, precisions, threads,
warm-up) as the commands do::

    index = hippo_gpu.load_index("my_index")
    hits = hippo_gpu.Searcher(index).retrieve(["Who founded ...?"], top_k=10)
    searcher = hippo_gpu.SearcherSpec(Path("my_index"), device="cuda", warm_up=True).open()
"""

from hippo_gpu.build import build_index
from hippo_gpu.config import EncoderConfig, GraphConfig, IndexConfig, RetrievalConfig
from hippo_gpu.errors import HippoGpuError
from hippo_gpu.explanation import HitExplanation, QueryExplanation
from hippo_gpu.index import Index, __version__
from hippo_gpu.results import Hit, Ranking
from hippo_gpu.search import Searcher
from hippo_gpu.searcher_spec import SearcherSpec
from hippo_gpu.versions import load_index
from hippo_gpu.writer import IndexWriter

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
    "SearcherSpec",
    "__version__",
    "build_index",
    "load_index",
]
