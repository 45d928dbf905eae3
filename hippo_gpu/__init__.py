"""hippo_gpu: HippoRAG (v1 and 2) retrieval as batched tensor work on CPU and CUDA."""

from hippo_gpu.config import EncoderConfig, GraphConfig, IndexConfig
from hippo_gpu.index import Index, __version__, build_index, load_index
from hippo_gpu.search import Hit

__all__ = [
    "EncoderConfig",
    "GraphConfig",
    "Hit",
    "Index",
    "IndexConfig",
    "__version__",
    "build_index",
    "load_index",
]
