"""Phrase kNN (faiss or chunked torch top-k) -> synonym edges.

Upstream HippoRAG 2 takes the k = 2047 nearest phrases of every phrase by exact cosine and walks
them in descending order: it stops at the first neighbour below the threshold (0.8) or once 101
have been accepted, and skips the phrase itself and the empty phrase. Only the first
`max_neighbors + 2` candidates can ever be accepted (101 accepted plus at most two skipped: the
phrase itself and the empty phrase), so asking the kNN for that many is exactly equivalent to
asking for 2047 and far cheaper at scale.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import numpy as np
import torch

from hippo_gpu.config import GraphConfig

log = logging.getLogger(__name__)

_NON_ALNUM = re.compile(r"[^A-Za-z0-9]")


def _faiss():
    try:
        import faiss
    except ImportError as e:  # faiss-cpu is a core dependency; this means a broken install
        raise ImportError(
            "faiss is required for the faiss kNN backends (pip install faiss-cpu)") from e
    return faiss


def faiss_gpu_available() -> bool:
    try:
        faiss = _faiss()
    except ImportError:
        return False
    return torch.cuda.is_available() and hasattr(faiss, "StandardGpuResources") and \
        faiss.get_num_gpus() > 0


def resolve_knn_backend(backend: str, device: torch.device) -> str:
    if backend != "auto":
        return backend
    if device.type == "cuda":
        return "faiss-gpu" if faiss_gpu_available() else "torch"
    return "faiss-flat"


def knn(
    vectors: torch.Tensor,
    k: int,
    *,
    backend: str = "faiss-flat",
    query_batch: int = 8192,
    hnsw_m: int = 32,
    ivf_lists: int | None = None,
    ivf_probe: int = 16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k inner-product neighbours of every row among all rows (itself included).

    For L2-normalised rows the inner product is the cosine. Exact backends: "faiss-flat"
    (IndexFlatIP), "faiss-gpu" (GpuIndexFlatIP), "torch" (chunked S = X_b X^T then top-k, on the
    device of `vectors`). Approximate: "faiss-hnsw", "faiss-ivf".

    Args:
        vectors: [M, D] float rows.
        k: neighbours per row, clipped to M.

    Returns:
        scores: [M, k] float32, descending per row.
        ids: [M, k] int64 row ids (-1 where an approximate index found fewer than k).
    """
    if vectors.dim() != 2:
        raise ValueError(f"vectors must be [M, D], got shape {tuple(vectors.shape)}")
    m = vectors.shape[0]
    k = min(k, m)
    if m == 0 or k == 0:
        empty = torch.zeros((m, k))
        return empty, empty.long()
    if backend == "torch":
        return _knn_torch(vectors.float(), k, query_batch)
    faiss = _faiss()
    x = np.ascontiguousarray(vectors.detach().float().cpu().numpy())
    d = x.shape[1]
    if backend == "faiss-flat":
        index = faiss.IndexFlatIP(d)
    elif backend == "faiss-gpu":
        if not faiss_gpu_available():
            raise RuntimeError(
                "knn backend 'faiss-gpu' needs CUDA and a faiss build with GPU support")
        res = faiss.StandardGpuResources()
        index = faiss.GpuIndexFlatIP(res, d)
    elif backend == "faiss-hnsw":
        index = faiss.IndexHNSWFlat(d, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = max(40, 2 * hnsw_m)
        index.hnsw.efSearch = max(2 * k, 64)
    elif backend == "faiss-ivf":
        nlist = ivf_lists or max(1, int(4 * np.sqrt(m)))
        quantizer = faiss.IndexFlatIP(d)
        index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(x)
        index.nprobe = min(ivf_probe, nlist)
    else:
        raise ValueError(f"unknown knn backend {backend!r}")
    index.add(x)
    scores = np.empty((m, k), dtype=np.float32)
    ids = np.empty((m, k), dtype=np.int64)
    for start in range(0, m, query_batch):
        s, i = index.search(x[start:start + query_batch], k)
        scores[start:start + query_batch] = s
        ids[start:start + query_batch] = i
    return torch.from_numpy(scores), torch.from_numpy(ids)


def _knn_torch(x: torch.Tensor, k: int, query_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    m = x.shape[0]
    scores = torch.empty((m, k), dtype=torch.float32, device=x.device)
    ids = torch.empty((m, k), dtype=torch.int64, device=x.device)
    for start in range(0, m, query_batch):
        sim = x[start:start + query_batch] @ x.T  # [B, M]
        s, i = torch.topk(sim, k, dim=1, largest=True, sorted=True)
        scores[start:start + query_batch] = s
        ids[start:start + query_batch] = i
    return scores.cpu(), ids.cpu()


APPROXIMATE_BACKENDS = ("faiss-hnsw", "faiss-ivf")


def knn_recall(vectors: torch.Tensor, ids: torch.Tensor, *, sample: int = 1000,
               seed: int = 0) -> float:
    """Recall of approximate kNN `ids` [M, k] against exact search, on up to `sample` rows.

    recall = mean over sampled rows of |approx ∩ exact| / k, exact = top-k of x_i X^T.
    """
    m, k = ids.shape
    if m == 0 or k == 0:
        return 1.0
    g = torch.Generator().manual_seed(seed)
    rows = torch.randperm(m, generator=g)[: min(sample, m)]
    x = vectors.float().cpu()
    hits = torch.zeros(rows.numel(), dtype=torch.float64)
    for start in range(0, rows.numel(), 64):  # [64, M] similarities at a time
        part = rows[start:start + 64]
        exact = torch.topk(x[part] @ x.T, k, dim=1).indices  # [B, k]
        found = (ids[part].unsqueeze(2) == exact.unsqueeze(1)).any(dim=2)  # [B, k]
        hits[start:start + 64] = found.sum(dim=1).double()
    return float(hits.mean() / k)


@dataclass(frozen=True)
class SynonymEdges:
    """Directed synonym assignments stats[(src, dst)] = score, as upstream stores them."""

    src: np.ndarray  # [E] int64 phrase rows
    dst: np.ndarray  # [E] int64 phrase rows
    score: np.ndarray  # [E] float32 cosine


def synonym_candidates_k(cfg: GraphConfig, num_phrases: int) -> int:
    """How many kNN candidates reproduce upstream's k = synonym_top_k walk exactly."""
    return min(cfg.synonym_top_k, cfg.synonym_max_neighbors + 2, num_phrases)


def select_synonym_edges(
    phrases: list[str], scores: torch.Tensor, ids: torch.Tensor, cfg: GraphConfig
) -> SynonymEdges:
    """Apply upstream's walk to kNN results, vectorised over all phrases.

    For phrase u (only if it has more than `synonym_min_alnum` alphanumeric characters) and its
    neighbours in descending score: stop at the first score < threshold; skip u itself and the
    empty phrase; accept at most `synonym_max_neighbors`.

    Args:
        phrases: [M] normalised phrase texts (row order of the kNN input).
        scores: [M, k] descending scores; ids: [M, k] neighbour rows (-1 = none).
    """
    s = scores.numpy().astype(np.float32, copy=False)
    i = ids.numpy()
    m = len(phrases)
    if s.size == 0:
        z = np.zeros(0, dtype=np.int64)
        return SynonymEdges(z, z, np.zeros(0, dtype=np.float32))
    alnum = np.fromiter((len(_NON_ALNUM.sub("", p)) for p in phrases), dtype=np.int64, count=m)
    eligible = alnum > cfg.synonym_min_alnum  # [M]
    empty = np.fromiter((p == "" for p in phrases), dtype=bool, count=m)
    rows = np.arange(m)[:, None]
    present = i >= 0
    stopped = np.maximum.accumulate((s < cfg.synonym_threshold) | ~present, axis=1)
    safe = np.where(present, i, 0)
    valid = present & (i != rows) & ~empty[safe]
    keep = valid & ~stopped
    keep &= np.cumsum(keep, axis=1) <= cfg.synonym_max_neighbors
    keep &= eligible[:, None]
    src, col = np.nonzero(keep)
    return SynonymEdges(src=src.astype(np.int64), dst=i[src, col].astype(np.int64),
                        score=s[src, col])
