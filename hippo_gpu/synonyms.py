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
import math
import re
from dataclasses import dataclass

import numpy as np
import torch

from hippo_gpu.config import GraphConfig
from hippo_gpu.cosine_join import (
    default_lists,
    exact_threshold_pairs,
    nearest_lists,
    probes_needed,
    spherical_kmeans,
    threshold_join,
)
from hippo_gpu.progress import progress

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


# "auto" searches exactly below this many phrases (musique_train's 16k stay exact, so its graph
# is the official one) and approximately from here on, where exact search is quadratic.
EXACT_BELOW = 50_000


def resolve_knn_backend(backend: str, device: torch.device, num_phrases: int = 0) -> str:
    """"auto": below EXACT_BELOW phrases exact search: faiss-gpu on CUDA, faiss-flat on the CPU,
    and the exact torch backend where faiss is not installed (faiss is an extra: [cpu] or
    [gpu]); from EXACT_BELOW phrases on, "ivf-join" (approximate, recall measured on held-out
    phrases, torch GEMMs on the index device; see `join_synonym_edges`), with or without faiss.
    """
    if backend != "auto":
        return backend
    if num_phrases >= EXACT_BELOW:
        return "ivf-join"
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


APPROXIMATE_BACKENDS = ("ivf-join", "faiss-hnsw", "faiss-ivf")


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
    eligible, empty = phrase_masks(phrases, cfg)  # [M] each
    own = np.arange(m) if rows is None else np.asarray(rows, dtype=np.int64)  # [R]
    return _walk(s, i, own, eligible, empty, cfg)


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
    if backend == "ivf-join":  # the affected rows are few: search them exactly
        backend = "torch"
    vectors = new_emb.float().to(device) if backend == "torch" else new_emb.float()
    scores, ids = knn(vectors, k, backend=backend, rows=rows)
    fresh = select_synonym_edges(new_phrases, scores, ids, cfg, rows=rows)
    edges = SynonymEdges(np.concatenate([kept.src, fresh.src]),
                         np.concatenate([kept.dst, fresh.dst]),
                         np.concatenate([kept.score, fresh.score]).astype(np.float32))
    return edges, int(len(rows))


# --- approximate synonym kNN at scale ---------------------------------------------------------


def phrase_masks(phrases: list[str], cfg: GraphConfig) -> tuple[np.ndarray, np.ndarray]:
    """([M] eligible for synonym edges, [M] is the empty phrase), as select_synonym_edges uses."""
    m = len(phrases)
    alnum = np.fromiter((len(_NON_ALNUM.sub("", p)) for p in phrases), dtype=np.int64, count=m)
    empty = np.fromiter((p == "" for p in phrases), dtype=bool, count=m)
    return alnum > cfg.synonym_min_alnum, empty


def _walk(scores: np.ndarray, ids: np.ndarray, rows: np.ndarray, eligible: np.ndarray,
          empty: np.ndarray, cfg: GraphConfig) -> SynonymEdges:
    """The walk of select_synonym_edges on [R, k] results of `rows`, phrase masks given."""
    own = rows[:, None]
    present = ids >= 0
    stopped = np.maximum.accumulate((scores < cfg.synonym_threshold) | ~present, axis=1)
    safe = np.where(present, ids, 0)
    keep = present & (ids != own) & ~empty[safe] & ~stopped
    keep &= np.cumsum(keep, axis=1) <= cfg.synonym_max_neighbors
    keep &= eligible[own]
    r, col = np.nonzero(keep)
    return SynonymEdges(src=rows[r].astype(np.int64), dst=ids[r, col].astype(np.int64),
                        score=scores[r, col].astype(np.float32))


def exact_topk(x: torch.Tensor, rows: np.ndarray, k: int,
               column_chunk: int = 1 << 15) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k inner products of x[rows] against all of x: ([R, k] scores, [R, k] ids).

    Chunked over the columns (a running top-k is merged per chunk), so memory is
    R x (k + column_chunk) whatever M is.
    """
    q = x[torch.from_numpy(rows)]  # [R, D]
    best_s = torch.full((len(rows), 0), float("-inf"))
    best_i = torch.zeros((len(rows), 0), dtype=torch.int64)
    for start in range(0, x.shape[0], column_chunk):
        sim = q @ x[start:start + column_chunk].T  # [R, C]
        s, i = torch.topk(sim, min(k, sim.shape[1]), dim=1)
        cat_s, cat_i = torch.cat([best_s, s], 1), torch.cat([best_i, i + start], 1)
        top = torch.topk(cat_s, min(k, cat_s.shape[1]), dim=1).indices
        best_s, best_i = cat_s.gather(1, top), cat_i.gather(1, top)
    return best_s.numpy(), best_i.numpy()


def _cap_per_source(src: np.ndarray, dst: np.ndarray, score: np.ndarray,
                    max_neighbors: int) -> SynonymEdges:
    """Per source, its `max_neighbors` best pairs by score (the walk's acceptance order)."""
    order = np.lexsort((-score, src))
    src, dst, score = src[order], dst[order], score[order]
    starts = np.searchsorted(src, src, side="left")
    cap = (np.arange(len(src)) - starts) < max_neighbors
    return SynonymEdges(src[cap], dst[cap], score[cap].astype(np.float32))


def symmetrize_synonym_edges(edges: SynonymEdges, eligible: np.ndarray,
                             max_neighbors: int) -> SynonymEdges:
    """Each found pair in both orientations (where the source is eligible), duplicates dropped,
    then per source the `max_neighbors` best by score (the walk accepts the best ones first).
    """
    m = len(eligible)
    src = np.concatenate([edges.src, edges.dst])
    dst = np.concatenate([edges.dst, edges.src])
    score = np.concatenate([edges.score, edges.score])
    keep = eligible[src] & (src != dst)
    src, dst, score = src[keep], dst[keep], score[keep]
    _, first = np.unique(src * max(m, 1) + dst, return_index=True)
    return _cap_per_source(src[first].astype(np.int64), dst[first].astype(np.int64),
                           score[first], max_neighbors)


def edge_recall(approx: SynonymEdges, exact: SynonymEdges) -> float:
    """|approx ∩ exact| / |exact| over (src, dst) pairs (1.0 when exact has no edge)."""
    if len(exact.src) == 0:
        return 1.0
    want = set(zip(exact.src.tolist(), exact.dst.tolist()))
    got = set(zip(approx.src.tolist(), approx.dst.tolist()))
    return len(want & got) / len(want)


def sample_recall(edges: SynonymEdges, rows: np.ndarray, exact: SynonymEdges,
                  num_phrases: int) -> float:
    """edge_recall of the `edges` whose source is one of `rows` against `exact` (the exact
    edges of those rows): the sampled recall the approximate builds report."""
    mine = np.zeros(num_phrases, dtype=bool)
    mine[rows] = True
    pick = mine[edges.src]
    return edge_recall(SynonymEdges(edges.src[pick], edges.dst[pick], edges.score[pick]), exact)


class _AnnIndex:
    """The approximate index behind `approximate_synonym_edges`, with one knob to widen.

    "ivf" (knn_backend "faiss-ivf"; "auto" uses ivf-join instead, see join_synonym_edges,
    about 4x faster at 1.7M phrases): IVF-flat with 4·sqrt(M) k-means lists
    (trained on 64 rows per list); the knob is nprobe, from 8 (the recall checks of
    approximate_synonym_edges double it until they pass: near-duplicates at cos >= the
    threshold mostly share a list, so few probes usually suffice and each doubling doubles the
    search). On CUDA with faiss-gpu it is
    trained and searched on the GPU (nprobe at most 2048, faiss-gpu's limit). "hnsw" (CPU):
    faiss IndexHNSWFlat, 16 links per node, efConstruction 40; the knob is efSearch, from 16.
    Measured on the synthetic corpus (hash:64 vectors), with the symmetric union of step 3 of
    approximate_synonym_edges: 170k phrases, IVF nprobe 32 recall 0.994 in 47 s, HNSW
    efSearch 16 0.987 in 38 s; but at 855k phrases HNSW needed efSearch 128 (532 s on a shared
    2-core machine) as its recall falls with size on these near-isotropic 64-d vectors, where
    IVF's cost grows as sqrt(M) per query at a fixed nprobe.
    """

    def __init__(self, x: np.ndarray, *, kind: str, cuda: bool,
                 show_progress: bool = False) -> None:
        faiss = _faiss()
        m, d = x.shape
        self.ivf = cuda or kind == "ivf"
        if self.ivf:
            nlist = max(1, min(m // 64, int(4 * np.sqrt(m))))
            quantizer = faiss.IndexFlatIP(d)
            index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
            index.cp.niter = 10
            index.cp.max_points_per_centroid = 64  # train k-means on a sample
            if cuda:
                self._res = faiss.StandardGpuResources()
                index = faiss.index_cpu_to_gpu(self._res, 0, index)
            index.train(x)
            index.add(x)
            self.index, self._quantizer = index, quantizer
            self.limit = min(nlist, 2048) if cuda else nlist
            self.value, self.name = min(8, nlist), "nprobe"
            self.info = {"nlist": nlist, "device": "cuda" if cuda else "cpu"}
        else:
            self.index = faiss.IndexHNSWFlat(d, 16, faiss.METRIC_INNER_PRODUCT)
            self.index.hnsw.efConstruction = 40
            with progress(total=m, desc="synonym kNN: HNSW build", unit="phrase",
                          disable=not show_progress) as bar:
                for start in range(0, m, 1 << 18):  # adds in blocks only to move the bar
                    self.index.add(x[start:start + (1 << 18)])
                    bar.update(min(1 << 18, m - start))
            self.limit, self.value, self.name = 4096, 16, "ef_search"
            self.info = {"hnsw_m": 16, "ef_construction": 40}

    def widen(self) -> bool:
        """Double the knob; False when it is already at its limit."""
        if self.value >= self.limit:
            return False
        self.value = min(2 * self.value, self.limit)
        return True

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.ivf:
            self.index.nprobe = self.value
        else:
            self.index.hnsw.efSearch = max(self.value, k)
        return self.index.search(np.ascontiguousarray(q), k)


def approximate_synonym_edges(
    phrases: list[str], vectors: torch.Tensor, cfg: GraphConfig, *,
    device: torch.device | None = None, kind: str = "hnsw", target_recall: float = 0.97,
    tune_recall: float = 0.85, recall_sample: int = 1000, chunk: int = 65536, seed: int = 0,
    show_progress: bool = False,
) -> tuple[SynonymEdges, dict]:
    """Synonym edges from an approximate kNN (HNSW on CPU, IVF on CUDA: see _AnnIndex), with
    their recall measured.

    1. The exact lists of `recall_sample` eligible phrases (exact_topk, chunked GEMM, then the
       walk). The index's knob (efSearch / nprobe) doubles until the sample's approximate lists
       hold `tune_recall` of those edges.
    2. All eligible phrases are searched in chunks of `chunk` rows: first for k0 = 16
       candidates, and only the rows whose 16th candidate still clears the threshold again with
       the full k. The walk stops at the first score below the threshold, so a row whose k0-th
       score is below it has all its accepted neighbours among the first k0: the same edges as
       a search for k. Memory: chunk x k results at a time, never M x k.
    3. The lists are made symmetric (symmetrize_synonym_edges): cos is symmetric, so v is in
       u's exact list whenever u is in v's (both eligible, fewer than max_neighbors above the
       threshold), and a pair either search found counts for both.
    4. Recall = |final ∩ exact| / |exact| over the sample's (phrase, synonym) pairs: measured
       on the edges returned, not estimated from a separate run. Below `target_recall` the
       knob doubles and step 2 runs again.

    Returns (edges, info): info holds backend, k, the index settings (ef_search or nprobe),
    recall_vs_exact (the sampled edge recall), recall_sample, recall_edges (exact edges in the
    sample).
    """
    m = len(phrases)
    k = synonym_candidates_k(cfg, m)
    eligible, empty = phrase_masks(phrases, cfg)
    x_t = vectors.detach().float().cpu().contiguous()
    x = x_t.numpy()
    cuda = device is not None and device.type == "cuda" and faiss_gpu_available()
    if kind not in ("hnsw", "ivf"):
        raise ValueError(f"approximate kNN kind must be 'hnsw' or 'ivf', got {kind!r}")
    info: dict = {"backend": "faiss-ivf" if cuda or kind == "ivf" else "faiss-hnsw", "k": k}
    rows_all = np.nonzero(eligible)[0]
    none = SynonymEdges(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))
    if m < 2 or k < 2 or len(rows_all) == 0:
        return none, {**info, "recall_vs_exact": 1.0}
    index = _AnnIndex(x, kind=kind, cuda=cuda, show_progress=show_progress)
    info.update(index.info)

    def edges_of(rows: np.ndarray, search) -> SynonymEdges:  # type: ignore[no-untyped-def]
        k0 = min(k, 16)
        s, i = search(x[rows], k0)
        more = (s[:, -1] >= cfg.synonym_threshold) & (i[:, -1] >= 0) if k0 < k else \
            np.zeros(len(rows), dtype=bool)
        parts = [_walk(s[~more], i[~more], rows[~more], eligible, empty, cfg)]
        if more.any():
            s2, i2 = search(x[rows[more]], k)
            parts.append(_walk(s2, i2, rows[more], eligible, empty, cfg))
        return SynonymEdges(np.concatenate([e.src for e in parts]),
                            np.concatenate([e.dst for e in parts]),
                            np.concatenate([e.score for e in parts]))

    sample = np.sort(np.random.default_rng(seed).choice(
        rows_all, min(recall_sample, len(rows_all)), replace=False))
    es, ei = exact_topk(x_t, sample, k)
    exact = _walk(es, ei, sample, eligible, empty, cfg)
    # widen until the sample's own lists reach `tune_recall`; the symmetric union over all
    # phrases' lists (below) then finds most of the rest: a pair is missed only when both of its
    # searches miss it, about (1 - r)^2 for a one-sided recall r (measured on 256k synthetic
    # phrases, IVF: one-sided 0.80 / 0.87 / 0.91 at nprobe 8 / 16 / 32, symmetric >= 0.98 at 16)
    while edge_recall(edges_of(sample, index.search), exact) < tune_recall and index.widen():
        pass
    while True:
        parts = []
        with progress(total=len(rows_all), desc="synonym kNN: search", unit="phrase",
                      disable=not show_progress) as bar:
            for start in range(0, len(rows_all), chunk):
                parts.append(edges_of(rows_all[start:start + chunk], index.search))
                bar.update(min(chunk, len(rows_all) - start))
        edges = symmetrize_synonym_edges(
            SynonymEdges(np.concatenate([e.src for e in parts]),
                         np.concatenate([e.dst for e in parts]),
                         np.concatenate([e.score for e in parts]).astype(np.float32)),
            eligible, cfg.synonym_max_neighbors)
        recall = sample_recall(edges, sample, exact, m)
        if recall >= target_recall or not index.widen():
            break
    info.update({index.name: index.value}, recall_vs_exact=round(recall, 4),
                recall_sample=int(len(sample)), recall_edges=int(len(exact.src)))
    return edges, info


def join_synonym_edges(
    phrases: list[str], vectors: torch.Tensor, cfg: GraphConfig, *,
    device: torch.device | None = None, target_recall: float = 0.97, recall_sample: int = 3000,
    nlist: int | None = None, max_probes: int = 256, seed: int = 0, show_progress: bool = False,
) -> tuple[SynonymEdges, dict]:
    """Synonym edges from the inverted-file threshold join of `cosine_join`, with the number
    of probes chosen on one sample of phrases and the recall reported on another.

    The walk of `select_synonym_edges` accepts, for an eligible phrase u, its non-empty
    neighbours v != u with cos(u, v) >= threshold, best first, at most `synonym_max_neighbors`:
    a property of the pairs above the threshold, which is what the join returns.

    1. Two disjoint seeded samples of `recall_sample` eligible phrases: "tune" and "held".
       Their exact edges come from brute-force GEMMs (`exact_threshold_pairs`, then the cap).
    2. `spherical_kmeans` with nlist = `default_lists(M)` lists. For the tune sample's exact
       edges, `probes_needed` gives the probes p at which the symmetric join finds each one;
       p = the smallest value at which `target_recall` of them are found (at most
       `max_probes`, at most nlist).
    3. Probes [M, p] for every phrase, the join for every eligible phrase, self pairs and the
       empty phrase dropped, then `symmetrize_synonym_edges` (both orientations, the cap).
    4. recall_vs_exact = |final ∩ exact| / |exact| over the held sample's edges: measured on
       phrases that did not choose p. recall_tune is the same on the tune sample.

    Runs on `device` (default: the device of `vectors`): every GEMM, the k-means and the top-p
    are torch. Returns (edges, info) with backend, threshold, nlist, nprobe, recall_vs_exact,
    recall_tune, recall_sample and recall_edges (the held sample's), and probes_needed
    quantiles of the tune sample.
    """
    m = len(phrases)
    thr = cfg.synonym_threshold
    eligible, empty = phrase_masks(phrases, cfg)
    dev = device if device is not None else vectors.device
    x = vectors.detach().to(dev).float().contiguous()
    rows_all = np.nonzero(eligible)[0]
    info: dict = {"backend": "ivf-join", "threshold": thr}
    none = SynonymEdges(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))
    if m < 2 or len(rows_all) == 0:
        return none, {**info, "recall_vs_exact": 1.0}
    if thr <= 0:
        raise ValueError("the ivf-join synonym backend needs GraphConfig.synonym_threshold > 0, "
                         f"got {thr}: use knn_backend='faiss-flat' or 'torch'")

    def exact_edges(rows: np.ndarray) -> SynonymEdges:
        s, d, sc = exact_threshold_pairs(x, rows, thr)
        keep = (s != d) & ~empty[d]
        return _cap_per_source(s[keep], d[keep], sc[keep], cfg.synonym_max_neighbors)

    rng = np.random.default_rng(seed)
    n = min(recall_sample, len(rows_all) // 2) or 1
    both = rng.choice(rows_all, min(2 * n, len(rows_all)), replace=False)
    tune, held = np.sort(both[:n]), np.sort(both[n:])
    nl = nlist or default_lists(m)
    cent = spherical_kmeans(x, nl, seed=seed)
    tune_exact = exact_edges(tune)
    width = min(max_probes, nl)
    if len(tune_exact.src):
        t_rows = np.unique(np.concatenate([tune_exact.src, tune_exact.dst]))
        row_of = {int(r): i for i, r in enumerate(t_rows.tolist())}
        t_probes = nearest_lists(x[torch.from_numpy(t_rows).to(dev)], cent, width).numpy()
        need = probes_needed(tune_exact.src, tune_exact.dst, t_probes, row_of,
                             eligible[tune_exact.dst])
        found = np.sort(need)
        at = int(math.ceil(target_recall * len(found))) - 1  # the target-quantile pair
        p = int(found[at]) if np.isfinite(found[at]) else width
        info["probes_needed"] = {q: float(np.quantile(need, q / 100)) for q in (50, 90, 99)}
    else:  # no exact pair in the sample: nothing to tune on
        p = min(8, nl)
    probes = nearest_lists(x, cent, p, show_progress=show_progress)
    s, d, sc = threshold_join(x, probes, rows_all, thr, show_progress=show_progress)
    del probes
    keep = (s != d) & ~empty[d]
    edges = symmetrize_synonym_edges(SynonymEdges(s[keep], d[keep], sc[keep]), eligible,
                                     cfg.synonym_max_neighbors)

    held_exact = exact_edges(held) if len(held) else none
    info.update(nlist=nl, nprobe=p, device=str(dev),
                recall_vs_exact=round(sample_recall(edges, held, held_exact, m), 4),
                recall_tune=round(sample_recall(edges, tune, tune_exact, m), 4),
                recall_sample=int(len(held)), recall_edges=int(len(held_exact.src)))
    return edges, info
