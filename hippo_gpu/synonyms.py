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
    except ImportError as e:
        raise ImportError(
            "the faiss kNN backends need faiss: pip install 'hippo-gpu[cpu]' (faiss-cpu) or "
            "'hippo-gpu[gpu]' (faiss-gpu-cu12), not both") from e
    return faiss


def faiss_available() -> bool:
    try:
        _faiss()
    except ImportError:
        return False
    return True


def faiss_gpu_available() -> bool:
    try:
        faiss = _faiss()
    except ImportError:
        return False
    return torch.cuda.is_available() and hasattr(faiss, "StandardGpuResources") and \
        faiss.get_num_gpus() > 0


def resolve_knn_backend(backend: str, device: torch.device) -> str:
    """"auto": exact search everywhere: faiss-gpu on CUDA, faiss-flat on the CPU, and the exact
    torch backend where faiss is not installed (faiss is an extra: [cpu] or [gpu])."""
    if backend != "auto":
        return backend
    if device.type == "cuda":
        return "faiss-gpu" if faiss_gpu_available() else "torch"
    if faiss_available():
        return "faiss-flat"
    log.warning("faiss is not installed: exact synonym kNN with torch (pip install "
                "'hippo-gpu[cpu]' for faiss-flat)")
    return "torch"


def knn(
    vectors: torch.Tensor,
    k: int,
    *,
    backend: str = "faiss-flat",
    query_batch: int = 8192,
    hnsw_m: int = 32,
    ivf_lists: int | None = None,
    ivf_probe: int = 16,
    rows: np.ndarray | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k inner-product neighbours of every row (or of `rows` only) among all rows (itself
    included).

    For L2-normalised rows the inner product is the cosine. Exact backends: "faiss-flat"
    (IndexFlatIP), "faiss-gpu" (GpuIndexFlatIP), "torch" (chunked S = X_b X^T then top-k, on the
    device of `vectors`). Approximate: "faiss-hnsw", "faiss-ivf".

    Args:
        vectors: [M, D] float rows.
        k: neighbours per row, clipped to M.
        rows: [R] the rows to search for (default: all M); results are in this order.

    Returns:
        scores: [R, k] float32, descending per row.
        ids: [R, k] int64 row ids (-1 where an approximate index found fewer than k).
    """
    if vectors.dim() != 2:
        raise ValueError(f"vectors must be [M, D], got shape {tuple(vectors.shape)}")
    m = vectors.shape[0]
    k = min(k, m)
    query_rows = np.arange(m) if rows is None else np.asarray(rows, dtype=np.int64)
    r = len(query_rows)
    if m == 0 or k == 0 or r == 0:
        empty = torch.zeros((r, k))
        return empty, empty.long()
    if backend == "torch":
        return _knn_torch(vectors.float(), k, query_batch, query_rows)
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
    queries = x if rows is None else x[query_rows]
    scores = np.empty((r, k), dtype=np.float32)
    ids = np.empty((r, k), dtype=np.int64)
    for start in range(0, r, query_batch):
        s, i = index.search(queries[start:start + query_batch], k)
        scores[start:start + query_batch] = s
        ids[start:start + query_batch] = i
    return torch.from_numpy(scores), torch.from_numpy(ids)


def _knn_torch(x: torch.Tensor, k: int, query_batch: int,
               rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    r = len(rows)
    q_idx = torch.from_numpy(rows).to(x.device)
    scores = torch.empty((r, k), dtype=torch.float32, device=x.device)
    ids = torch.empty((r, k), dtype=torch.int64, device=x.device)
    for start in range(0, r, query_batch):
        sim = x.index_select(0, q_idx[start:start + query_batch]) @ x.T  # [B, M]
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
    phrases: list[str], scores: torch.Tensor, ids: torch.Tensor, cfg: GraphConfig,
    rows: np.ndarray | None = None,
) -> SynonymEdges:
    """Apply upstream's walk to kNN results, vectorised over all phrases.

    For phrase u (only if it has more than `synonym_min_alnum` alphanumeric characters) and its
    neighbours in descending score: stop at the first score < threshold; skip u itself and the
    empty phrase; accept at most `synonym_max_neighbors`.

    Args:
        phrases: [M] normalised phrase texts (row order of the kNN input).
        scores: [R, k] descending scores; ids: [R, k] neighbour rows (-1 = none).
        rows: [R] the phrase row of each kNN row (default: 0..M-1, every phrase).
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
    own = (np.arange(m) if rows is None else np.asarray(rows, dtype=np.int64))[:, None]  # [R, 1]
    present = i >= 0
    stopped = np.maximum.accumulate((s < cfg.synonym_threshold) | ~present, axis=1)
    safe = np.where(present, i, 0)
    valid = present & (i != own) & ~empty[safe]
    keep = valid & ~stopped
    keep &= np.cumsum(keep, axis=1) <= cfg.synonym_max_neighbors
    keep &= eligible[own]
    r, col = np.nonzero(keep)
    return SynonymEdges(src=own[r, 0].astype(np.int64), dst=i[r, col].astype(np.int64),
                        score=s[r, col])


# Margin below the threshold within which a changed phrase marks a phrase as affected: the
# cosine here comes from another GEMM than the kNN's, so a few ulps of slack make the affected
# set a superset (recomputing an unaffected list changes nothing).
_AFFECTED_MARGIN = 1e-4


def update_synonym_edges(
    old_phrases: list[str], old_emb: torch.Tensor, old: SynonymEdges,
    new_phrases: list[str], new_emb: torch.Tensor, cfg: GraphConfig, *,
    backend: str, device: torch.device, chunk: int = 8192,
) -> tuple[SynonymEdges, int]:
    """The synonym edges of `new_phrases` from those of `old_phrases`, recomputing only the
    phrases whose list can change. Returns (edges in new rows, number of phrases recomputed).

    Claim: the walk of `select_synonym_edges` for phrase u reads only the neighbours v with
    cos(u, v) >= threshold (it stops at the first one below), in descending order, plus u's
    own text (eligibility, skip rules). So u's accepted list can change only if a phrase with
    cos(u, x) >= threshold was added or removed. The affected set is therefore: the added
    phrases, and every phrase within the threshold (less a small margin) of an added or removed
    phrase. Their lists are recomputed by kNN against the new phrase set; every other list is
    copied, with its rows renumbered. The result equals a fresh `select_synonym_edges` on the
    new set, except where two neighbours tie exactly at the `synonym_max_neighbors` cut (then
    the kNN's tie order, which depends on row numbers, decides in both). Cost: one [C, M] GEMM
    for the C changed phrases and a kNN for the affected rows only.
    """
    new_row = {p: i for i, p in enumerate(new_phrases)}
    old_set = set(old_phrases)
    added = np.array([i for i, p in enumerate(new_phrases) if p not in old_set], dtype=np.int64)
    removed = np.array([j for j, p in enumerate(old_phrases) if p not in new_row],
                       dtype=np.int64)
    m = len(new_phrases)
    affected = np.zeros(m, dtype=bool)
    affected[added] = True
    changed = torch.cat([new_emb[torch.from_numpy(added)].float(),
                         old_emb[torch.from_numpy(removed)].float()]).to(device)  # [C, D]
    if changed.shape[0] and m:
        base = new_emb.float().to(device)
        for start in range(0, m, chunk):
            best = (base[start:start + chunk] @ changed.T).max(dim=1).values  # [B]
            affected[start:start + chunk] |= \
                (best >= cfg.synonym_threshold - _AFFECTED_MARGIN).cpu().numpy()
    # copy the lists of unaffected phrases, renumbered (their neighbours all survive: a removed
    # neighbour would be within the threshold, making the phrase affected)
    to_new = np.array([new_row.get(p, -1) for p in old_phrases], dtype=np.int64)
    src_new = to_new[old.src] if len(old.src) else old.src
    keep = (src_new >= 0) & ~affected[np.maximum(src_new, 0)]
    kept = SynonymEdges(src_new[keep], to_new[old.dst[keep]], old.score[keep])
    if (kept.dst < 0).any():
        raise AssertionError("a kept synonym points to a removed phrase")  # the claim above
    rows = np.nonzero(affected)[0]
    k = synonym_candidates_k(cfg, m)
    vectors = new_emb.float().to(device) if backend == "torch" else new_emb.float()
    scores, ids = knn(vectors, k, backend=backend, rows=rows)
    fresh = select_synonym_edges(new_phrases, scores, ids, cfg, rows=rows)
    edges = SynonymEdges(np.concatenate([kept.src, fresh.src]),
                         np.concatenate([kept.dst, fresh.dst]),
                         np.concatenate([kept.score, fresh.score]).astype(np.float32))
    return edges, int(len(rows))
