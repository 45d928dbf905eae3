"""Vector search: the nearest rows of every row by inner product (cosine on unit rows).

Exact: `knn` with "torch" (chunked S = X_b X^T then top-k, on the device of the vectors),
"faiss-flat" (IndexFlatIP) or "faiss-gpu" (GpuIndexFlatIP), and `exact_topk` (column-chunked,
memory independent of M). Approximate: `knn` with "faiss-hnsw" or "faiss-ivf", and `AnnIndex`
(the widenable IVF/HNSW index behind synonyms.approximate_synonym_edges); `knn_recall` measures
them against exact search. `resolve_knn_backend` chooses the backend "auto" means. faiss is an
optional extra ([cpu] or [gpu]): it is imported on first use, never at module import.

What the neighbours mean (upstream's synonym walk over them) is indexing/synonyms.py's business; the
threshold join that replaces top-k at scale is indexing/cosine_join.py.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from hippo_gpu.progress import progress

log = logging.getLogger(__name__)


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
    phrases, torch GEMMs on the index device; see `synonyms.join_synonym_edges`), with or
    without faiss.
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


class RunningTopK:
    """The top-k of some query rows over column blocks seen one at a time: each block's
    [R, B] products give their own top-k, merged with the best so far (memory R x (k + B)).

    Claim: the top-k of a union is the top-k of the union of each part's top-k (an entry
    outside its part's top-k has k larger entries in that part), so merging block by block
    gives the top-k over all columns seen, whatever the block sizes.
    """

    def __init__(self, rows: int, k: int, device: torch.device) -> None:
        self.k = k
        self.scores = torch.full((rows, 0), float("-inf"), device=device)
        self.ids = torch.zeros((rows, 0), dtype=torch.int64, device=device)

    def add(self, sim: torch.Tensor, start: int) -> None:
        """Merge the products `sim` [R, B] of columns start .. start + B - 1."""
        s, i = torch.topk(sim, min(self.k, sim.shape[1]), dim=1)
        cat_s, cat_i = torch.cat([self.scores, s], 1), torch.cat([self.ids, i + start], 1)
        top = torch.topk(cat_s, min(self.k, cat_s.shape[1]), dim=1).indices
        self.scores, self.ids = cat_s.gather(1, top), cat_i.gather(1, top)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """([R, k] scores, [R, k] column ids), best first, on the CPU."""
        return self.scores.cpu().numpy(), self.ids.cpu().numpy()


def exact_topk(x: torch.Tensor, rows: np.ndarray, k: int,
               column_chunk: int = 1 << 15) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k inner products of x[rows] against all of x: ([R, k] scores, [R, k] ids).

    Chunked over the columns (RunningTopK), so memory is R x (k + column_chunk) whatever M is,
    and each chunk's products stay in cache (at 2.5M rows of 64 floats, 20 query rows: 0.26 s
    against 0.41 s for knn's one [R, M] product and top-k, the same ids and scores). Runs on
    the device of `x`; the results come back to the CPU.
    """
    q = x[torch.from_numpy(rows).to(x.device)]  # [R, D]
    top = RunningTopK(len(rows), k, x.device)
    for start in range(0, x.shape[0], column_chunk):
        top.add(q @ x[start:start + column_chunk].T, start)
    return top.result()


class AnnIndex:
    """An approximate inner-product index with one knob to widen (synonyms.approximate_synonym_edges
    doubles it until its recall checks pass).

    "ivf" (knn_backend "faiss-ivf"; "auto" uses ivf-join instead, see
    synonyms.join_synonym_edges, about 4x faster at 1.7M phrases): IVF-flat with 4·sqrt(M)
    k-means lists (trained on 64 rows per list); the knob is nprobe, from 8 (near-duplicates at
    cos >= the threshold mostly share a list, so few probes usually suffice and each doubling
    doubles the search). On CUDA with faiss-gpu it is trained and searched on the GPU (nprobe
    at most 2048, faiss-gpu's limit). "hnsw" (CPU): faiss IndexHNSWFlat, 16 links per node,
    efConstruction 40; the knob is efSearch, from 16. Measured on the synthetic corpus (hash:64
    vectors), with the symmetric union of step 3 of synonyms.approximate_synonym_edges: 170k
    phrases, IVF nprobe 32 recall 0.994 in 47 s, HNSW efSearch 16 0.987 in 38 s; but at 855k
    phrases HNSW needed efSearch 128 (532 s on a shared 2-core machine) as its recall falls
    with size on these near-isotropic 64-d vectors, where IVF's cost grows as sqrt(M) per query
    at a fixed nprobe.
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
