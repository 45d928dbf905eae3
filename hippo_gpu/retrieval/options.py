"""SearcherOptions: how a Searcher runs its queries, as one frozen value.

The retrieval settings (what a ranking computes) are `hippo_gpu.config.RetrievalConfig`; these
are the rest: how the query encoder runs and whether stages are timed apart on a GPU. A
`Searcher` holds one (`Searcher.options`) and hands it on unchanged to a searcher over another
version of its index (`Searcher.over`); a `SearcherSpec` embeds one, so the commands and the Ray
replicas open their searchers with the same value. Each option is spelt here only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hippo_gpu.config import ENCODER_BACKENDS, PRECISIONS

__all__ = ["SearcherOptions"]


@dataclass(frozen=True)
class SearcherOptions:
    """How a Searcher runs its queries (hippo_gpu.retrieval.searcher.Searcher).

    Attributes:
        query_precision: the query encoder's precision (hippo_gpu.config.PRECISIONS; None: the
            index's encoder precision as the index's device runs it: float32 for a float16
            encoder off CUDA).
        query_batch_size: the query encoder's batch size (None: the index's encoder setting).
        query_backend: what runs the query encoder: "auto" (ONNX Runtime on a CPU when the
            `onnx` extra is installed and its vectors pass the parity check against torch,
            else torch), "torch" or "onnx" (hippo_gpu.embed.Encoder).
        query_base_url: for an index built with a server encoder ("openai:MODEL"), the URL of
            the server to query instead of the one the index recorded (None: the index's).
        cache_dir: embedding cache for the encoder (queries are not cached; entity texts are);
            a str is taken as a path.
        profile: synchronise CUDA between stages so `Ranking.stage_seconds` charges each stage
            its own device work (benchmarks, eval); off by default, so a served GPU query pays
            no syncs.
    """

    query_precision: str | None = None
    query_batch_size: int | None = None
    query_backend: str = "auto"
    query_base_url: str | None = None
    cache_dir: Path | None = None
    profile: bool = False

    def __post_init__(self) -> None:
        if self.query_precision is not None and self.query_precision not in PRECISIONS:
            raise ValueError(f"query_precision must be None or one of {PRECISIONS}, "
                             f"got {self.query_precision!r}")
        if self.query_backend not in ENCODER_BACKENDS:
            raise ValueError(f"query_backend must be one of {ENCODER_BACKENDS}, "
                             f"got {self.query_backend!r}")
        qbs = self.query_batch_size
        if qbs is not None and (isinstance(qbs, bool) or not isinstance(qbs, int) or qbs < 1):
            raise ValueError(f"query_batch_size must be None or an int >= 1, got {qbs!r}")
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", Path(self.cache_dir))
