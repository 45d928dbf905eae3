"""All pairs of unit rows whose cosine clears a threshold: an inverted-file self-join in GEMMs.

The synonym step needs, for every phrase u, the phrases v with cos(u, v) >= t (t = 0.8), not a
top-k list: the walk of `synonyms.select_synonym_edges` stops at the first neighbour below t. At
millions of phrases the exact join is quadratic, so the rows are partitioned and only likely
pairs are compared:

1. `spherical_kmeans` puts C = nlist unit centroids on the rows (Lloyd on a sample, inner
   product, centroids re-normalised).
2. `nearest_lists`: per row u, the ids of its p most similar centroids, best first
   (probes(u), [M, p]). Its first one is u's list: list(u) = probes(u)[0].
3. `threshold_join`: for every list c and every query row u with c in probes(u), the scores
   u · v of all members v of c (one GEMM per list and block of queries), kept where >= t.

Pair (u, v) is compared iff list(v) is in probes(u); a caller that also runs v as a query (the
join is symmetric in spirit: cos(u, v) = cos(v, u)) finds the pair iff
list(v) ∈ probes(u) or list(u) ∈ probes(v). That rule can be evaluated for any pair from the
probes alone, without a search: `probes_needed` returns, per known pair, the smallest p at
which it is found. A sample of exact pairs therefore tells in advance which p reaches a recall
(synonyms.join_synonym_edges picks p that way and reports the recall on a second sample).

Why not faiss IVF: its search scans each list once per query, at ~8 GFLOP/s on 2 cores (bound by
memory), while the same comparisons as one GEMM per list and query block run at ~250 GFLOP/s
here: each list's members are loaded once per block of queries that probe it. The threshold
filter reads each score block once more with a row max (~11 G scores/s), and only rows whose
maximum clears t are searched for their hits.

Shapes: M rows, D dims, C lists, p probes, R query rows.
Memory: probes [M, p] int16 (int32 if C > 32767), one query chunk's sort, one [B, n_c] score
block; the pairs found (3 numbers each). Cost: about M·p·(M / C) dot products plus M·C for the
probes: C ≈ 2·sqrt(M) roughly balances the two at the p the synthetic corpus needs (p = 33 at
1.7M rows, 31 at 8.55M: 86 s and 738 s of the bench_scale builds on 2 cores).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from hippo_gpu.progress import progress


def default_lists(m: int) -> int:
    """nlist for m rows: 2·sqrt(m), at least 1 and at most m / 32 (lists of >= 32 rows)."""
    return max(1, min(m // 32, int(round(2 * math.sqrt(m)))))


def spherical_kmeans(x: torch.Tensor, nlist: int, *, iters: int = 10, per_list: int = 64,
                     seed: int = 0, chunk: int = 8192) -> torch.Tensor:
    """[C, D] unit centroids of the unit rows x [M, D] (on x's device).

    Lloyd's iterations on a seeded sample of min(M, per_list·C) rows, assigning by inner
    product; a centroid that loses all its rows is re-seeded with a random sample row.
    """
    m = x.shape[0]
    if not 1 <= nlist <= m:
        raise ValueError(f"nlist must be in [1, {m}] for {m} rows, got {nlist}")
    g = torch.Generator().manual_seed(seed)
    sample = x[torch.randperm(m, generator=g)[: min(m, per_list * nlist)].to(x.device)].float()
    cent = sample[torch.randperm(len(sample), generator=g)[:nlist].to(x.device)].clone()
    assign = torch.empty(len(sample), dtype=torch.int64, device=x.device)
    for _ in range(iters):
        for start in range(0, len(sample), chunk):
            assign[start:start + chunk] = (sample[start:start + chunk] @ cent.T).argmax(dim=1)
        total = torch.zeros_like(cent).index_add_(0, assign, sample)
        empty = torch.bincount(assign, minlength=nlist) == 0
        if bool(empty.any()):
            pick = torch.randint(len(sample), (int(empty.sum()),), generator=g).to(x.device)
            total[empty] = sample[pick]
        cent = torch.nn.functional.normalize(total, dim=1)
    return cent


def nearest_lists(x: torch.Tensor, centroids: torch.Tensor, p: int, *, chunk: int = 4096,
                  show_progress: bool = False) -> torch.Tensor:
    """[M, p] ids of each row's p most similar centroids, best first, on the CPU (int16 when
    C fits, else int32).

    One [chunk, C] GEMM into a reused buffer per chunk, then the per-row selection: the numba
    insertion kernel (kernels/src/topk_cpu.py, ties to the lower id, ~2x torch.topk here) on the
    CPU, torch.topk on CUDA or where numba is missing.
    """
    import hippo_gpu.kernels as kernels

    c = centroids.shape[0]
    p = min(p, c)
    dtype = torch.int16 if c <= 32767 else torch.int32
    out = torch.empty((x.shape[0], p), dtype=dtype)
    cent_t = centroids.float().T.contiguous()  # [D, C]
    use_numba = kernels.AVAILABLE and not kernels.FORCE_TORCH and x.device.type == "cpu"
    sim_buf = torch.empty((chunk, c), dtype=torch.float32, device=x.device)
    ids_buf = np.empty((chunk, p), dtype=np.int32)
    with progress(total=x.shape[0], desc="synonym kNN: probes", unit="phrase",
                  disable=not show_progress) as bar:
        for start in range(0, x.shape[0], chunk):
            part = x[start:start + chunk].float()
            n = part.shape[0]
            sim = torch.mm(part, cent_t, out=sim_buf[:n])  # [B, C]
            if use_numba:
                from hippo_gpu.kernels.topk_cpu import top_p_rows

                top_p_rows(sim.numpy(), p, ids_buf[:n], threads=torch.get_num_threads())
                out[start:start + n] = torch.from_numpy(ids_buf[:n]).to(dtype)
            else:
                out[start:start + n] = torch.topk(sim, p, dim=1).indices.to(dtype).cpu()
            bar.update(n)
    return out


def probes_needed(pairs_u: np.ndarray, pairs_v: np.ndarray, probes: np.ndarray,
                  row_of: dict[int, int], v_is_query: np.ndarray) -> np.ndarray:
    """Per pair (u, v): the smallest p at which the join finds it (np.inf: not within the
    probes given).

    probes: [T, P] lists of the rows in `row_of` (row id -> row of `probes`); u is a query row,
    v is one when `v_is_query`. Found at p iff list(v) is among probes(u)[:p], or v is a query
    and list(u) is among probes(v)[:p].
    """
    pu = probes[[row_of[int(a)] for a in pairs_u]]  # [E, P]
    pv = probes[[row_of[int(b)] for b in pairs_v]]
    width = probes.shape[1]

    def first(rank: np.ndarray, target: np.ndarray) -> np.ndarray:
        hit = rank == target[:, None]
        return np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, np.inf)  # 1-based p

    need = first(pu, pv[:, 0])
    from_v = np.where(v_is_query, first(pv, pu[:, 0]), np.inf)
    need = np.minimum(need, from_v)
    return np.where(need <= width, need, np.inf)


def threshold_join(x: torch.Tensor, probes: torch.Tensor, query_rows: np.ndarray,
                   threshold: float, *, row_chunk: int = 1 << 19, block: int = 2048,
                   show_progress: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs (u, v, u · v) with u in `query_rows`, list(v) in probes(u) and u · v >= threshold
    (u == v included: callers drop it).

    Args:
        x: [M, D] unit rows (the device of x is where the GEMMs run).
        probes: [M, p] from `nearest_lists` (column 0 is each row's list).
        query_rows: [R] the rows to search for.

    Query rows are taken `row_chunk` at a time: their (list, row) probe pairs are sorted by list,
    and each list's members are compared with its queries in blocks of `block` rows. Returns
    numpy (src [H] int64, dst [H] int64, score [H] float32), grouped by chunk and list.
    """
    if threshold <= 0:
        raise ValueError(f"a threshold join needs a positive cosine threshold, got {threshold}")
    dev = x.device
    m, p = probes.shape
    c = int(probes.max()) + 1 if m else 0
    primary = probes[:, 0].long()
    order = torch.argsort(primary, stable=True)  # members of each list, contiguous
    bounds = torch.zeros(c + 1, dtype=torch.int64)
    bounds[1:] = torch.cumsum(torch.bincount(primary, minlength=c), 0)
    order_dev = order.to(dev)
    query_rows = np.asarray(query_rows, dtype=np.int64)
    src: list[torch.Tensor] = []
    dst: list[torch.Tensor] = []
    score: list[torch.Tensor] = []
    # reused buffers: a fresh [B, n_c] block per GEMM costs page faults (~2x here)
    q_buf = torch.empty((block, x.shape[1]), dtype=torch.float32, device=dev)
    sim_buf = torch.empty(block * 4096, dtype=torch.float32, device=dev)
    with progress(total=len(query_rows), desc="synonym kNN: join", unit="phrase",
                  disable=not show_progress) as bar:
        for start in range(0, len(query_rows), row_chunk):
            rows = torch.from_numpy(query_rows[start:start + row_chunk])
            lists = probes[rows].long().reshape(-1)  # [r·p]
            which = torch.arange(len(rows)).repeat_interleave(p)  # chunk row of each probe
            by_list = torch.argsort(lists, stable=True)
            lists, which = lists[by_list], which[by_list]
            qb = torch.zeros(c + 1, dtype=torch.int64)
            qb[1:] = torch.cumsum(torch.bincount(lists, minlength=c), 0)
            q_all = x[rows.to(dev)].float()  # [r, D]
            rows_dev, which_dev = rows.to(dev), which.to(dev)
            qb_l, b_l = qb.tolist(), bounds.tolist()
            for lst in range(c):
                q0, q1, m0, m1 = qb_l[lst], qb_l[lst + 1], b_l[lst], b_l[lst + 1]
                if q0 == q1 or m0 == m1:
                    continue
                members = order_dev[m0:m1]
                base = x[members].float().T.contiguous()  # [D, n_c]
                for b0 in range(q0, q1, block):
                    local = which_dev[b0:min(b0 + block, q1)]
                    n = local.shape[0]
                    q = torch.index_select(q_all, 0, local, out=q_buf[:n])  # [B, D]
                    if n * base.shape[1] > sim_buf.numel():
                        sim_buf = torch.empty(n * base.shape[1], device=dev)
                    sim = torch.mm(q, base, out=sim_buf[:n * base.shape[1]].view(n, -1))
                    hot = torch.nonzero(sim.amax(dim=1) >= threshold).squeeze(1)
                    if hot.numel() == 0:
                        continue
                    sub = sim[hot]
                    r, col = torch.nonzero(sub >= threshold, as_tuple=True)
                    src.append(rows_dev[local[hot[r]]])
                    dst.append(members[col])
                    score.append(sub[r, col])
            bar.update(len(rows))
    if not src:
        z = np.zeros(0, dtype=np.int64)
        return z, z.copy(), np.zeros(0, dtype=np.float32)
    return (torch.cat(src).cpu().numpy().astype(np.int64),
            torch.cat(dst).cpu().numpy().astype(np.int64),
            torch.cat(score).float().cpu().numpy())


def exact_threshold_pairs(x: torch.Tensor, rows: np.ndarray, threshold: float, *,
                          column_chunk: int = 4096) -> tuple[np.ndarray, np.ndarray,
                                                             np.ndarray]:
    """Every pair (u, v, u · v) with u in `rows`, any v, u · v >= threshold (brute force in
    [R, column_chunk] GEMM blocks into one reused buffer; u == v included)."""
    rows_t = torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(x.device)
    q = x[rows_t].float()  # [R, D]
    buf = torch.empty((len(rows_t), column_chunk), dtype=torch.float32, device=x.device)
    src, dst, score = [], [], []
    for start in range(0, x.shape[0], column_chunk):
        part = x[start:start + column_chunk].float()
        sim = torch.mm(q, part.T, out=buf[:, :part.shape[0]])  # [R, C]
        hot = torch.nonzero(sim.amax(dim=1) >= threshold).squeeze(1)  # rows with a hit
        sub = sim[hot]
        r, col = torch.nonzero(sub >= threshold, as_tuple=True)
        src.append(rows_t[hot[r]])
        dst.append(col + start)
        score.append(sub[r, col])
    return (torch.cat(src).cpu().numpy().astype(np.int64),
            torch.cat(dst).cpu().numpy().astype(np.int64),
            torch.cat(score).float().cpu().numpy())
