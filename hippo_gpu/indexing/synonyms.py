"""Synonym edges: upstream HippoRAG 2's rule over phrase neighbours, and the strategies that
compute it (exact kNN + walk, approximate kNN + walk, threshold join, incremental update).

The rule. Upstream takes the k = 2047 nearest phrases of every phrase by exact cosine and walks
them in descending order: it stops at the first neighbour below the threshold (0.8) or once 101
have been accepted, and skips the phrase itself and the empty phrase. Only the first
`max_neighbors + 2` candidates can ever be accepted (101 accepted plus at most two skipped: the
phrase itself and the empty phrase), so asking the kNN for that many is exactly equivalent to
asking for 2047 and far cheaper at scale.

What is here: `SynonymEdges` (the result), the walk (`select_synonym_edges`, `phrase_masks`,
`_walk`), the symmetric union and per-source cap the approximate strategies use, their recall
helpers (`edge_recall`, `sample_recall`), the strategies (`approximate_synonym_edges`,
`join_synonym_edges`, `update_synonym_rows`), and `synonym_edges`, the one entry point the
build calls: it resolves the backend and picks the strategy. The neighbour searches themselves
(torch top-k, faiss flat/IVF/HNSW) are indexing/vector_search.py; the threshold join is
indexing/cosine_join.py.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hippo_gpu.config import GraphConfig
from hippo_gpu.indexing.cosine_join import (
    default_lists,
    exact_threshold_pairs,
    nearest_lists,
    probes_needed,
    spherical_kmeans,
    threshold_join,
)
from hippo_gpu.indexing.vector_search import (
    APPROXIMATE_BACKENDS,
    AnnIndex,
    RunningTopK,
    exact_topk,
    faiss_gpu_available,
    knn,
    resolve_knn_backend,
)
from hippo_gpu.progress import progress

log = logging.getLogger(__name__)

_NON_ALNUM = re.compile(r"[^A-Za-z0-9]")


@dataclass(frozen=True)
class SynonymEdges:
    """Directed synonym assignments stats[(src, dst)] = score, as upstream stores them."""

    src: np.ndarray  # [E] int64 phrase rows
    dst: np.ndarray  # [E] int64 phrase rows
    score: np.ndarray  # [E] float32 cosine


def _no_edges() -> SynonymEdges:
    return SynonymEdges(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))


def concat_edges(parts: Sequence[SynonymEdges]) -> SynonymEdges:
    return SynonymEdges(np.concatenate([e.src for e in parts]),
                        np.concatenate([e.dst for e in parts]),
                        np.concatenate([e.score for e in parts]).astype(np.float32))


def synonym_candidates_k(cfg: GraphConfig, num_phrases: int) -> int:
    """How many kNN candidates reproduce upstream's k = synonym_top_k walk exactly."""
    return min(cfg.synonym_top_k, cfg.synonym_max_neighbors + 2, num_phrases)


def phrase_masks(phrases: Sequence[str], cfg: GraphConfig,
                 rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """([M] eligible for synonym edges, [M] is the empty phrase), as select_synonym_edges uses;
    with `rows`, only those rows are read and set (the others are False): a walk over a few
    rows reads a few texts, not all M."""
    m = len(phrases)
    if rows is None:
        alnum = np.fromiter((len(_NON_ALNUM.sub("", p)) for p in phrases), dtype=np.int64,
                            count=m)
        empty = np.fromiter((p == "" for p in phrases), dtype=bool, count=m)
        return alnum > cfg.synonym_min_alnum, empty
    eligible, empty = np.zeros(m, dtype=bool), np.zeros(m, dtype=bool)
    for r in rows.tolist():
        text = phrases[r]
        eligible[r] = len(_NON_ALNUM.sub("", text)) > cfg.synonym_min_alnum
        empty[r] = text == ""
    return eligible, empty


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


def select_synonym_edges(
    phrases: Sequence[str], scores: torch.Tensor, ids: torch.Tensor, cfg: GraphConfig,
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
        return _no_edges()
    own = np.arange(m) if rows is None else np.asarray(rows, dtype=np.int64)  # [R]
    needed = None if rows is None else np.unique(np.concatenate([own, i[i >= 0].ravel()]))
    eligible, empty = phrase_masks(phrases, cfg, needed)  # [M] each
    return _walk(s, i, own, eligible, empty, cfg)


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


# Margin below the threshold within which a changed phrase marks a phrase as affected: the
# cosine here comes from another GEMM than the kNN's, so a few ulps of slack make the affected
# set a superset (recomputing an unaffected list changes nothing).
_AFFECTED_MARGIN = 1e-4
_KNN_BATCH_BYTES = 1 << 30  # update_synonym_rows: the [B, M] float32 similarities of one batch
# update_synonym_rows: phrase rows per [C, B] product of the scan and per column chunk of the
# affected rows' top-k (products that stay in cache)
BLOCK_ROWS = 1 << 16


def kept_synonyms(old: SynonymEdges, to_new: np.ndarray, affected: np.ndarray) -> SynonymEdges:
    """The old lists of the phrases whose list does not change (`affected` [M] false, the source
    kept), renumbered by `to_new` [M_old] (-1: removed). Their neighbours all survive: a removed
    neighbour would be within the threshold, making the phrase affected (update_synonym_rows);
    an edge to a removed phrase therefore means the affected set is wrong, and raises."""
    src_new = to_new[old.src] if len(old.src) else old.src
    keep = (src_new >= 0) & ~affected[np.maximum(src_new, 0)]
    kept = SynonymEdges(src_new[keep].astype(np.int64), to_new[old.dst[keep]].astype(np.int64),
                        old.score[keep].astype(np.float32))
    if (kept.dst < 0).any():
        raise ValueError("a kept synonym points to a removed phrase: the affected set misses "
                         "its source")
    return kept


def update_synonym_rows(
    to_new: np.ndarray, old: SynonymEdges, new_phrases: Sequence[str], new_emb: torch.Tensor,
    added: np.ndarray, removed_emb: torch.Tensor, cfg: GraphConfig, *,
    backend: str, device: torch.device, chunk: int = BLOCK_ROWS,
) -> tuple[SynonymEdges, SynonymEdges, np.ndarray]:
    """The synonym edges after phrases were added and removed, recomputing only the phrases
    whose list can change. Returns (kept edges, recomputed edges, recomputed source rows), all
    in the new rows; the new edge set is the two concatenated.

    Args:
        to_new: [M_old] new row of each old phrase row, -1 for a removed phrase.
        old: the old edges (old rows).
        new_phrases: [M] the new phrase texts (for the eligibility rules of the walk).
        new_emb: [M, D] the new phrase vectors.
        added: [a] rows (new numbering) of the phrases the old set lacks.
        removed_emb: [r, D] vectors of the removed phrases.

    Claim: the walk of `select_synonym_edges` for phrase u reads only the neighbours v with
    cos(u, v) >= threshold (it stops at the first one below), in descending order, plus u's
    own text (eligibility, skip rules). So u's accepted list can change only if a phrase with
    cos(u, x) >= threshold was added or removed. The affected set is therefore: the added
    phrases, and every phrase within the threshold (less a small margin) of an added or removed
    phrase. Their lists are recomputed by kNN against the new phrase set; every other list is
    copied, with its rows renumbered (monotone, hippo_gpu.versions.delta: each list keeps its
    order). The result equals a fresh `select_synonym_edges` on the new set, except where two
    neighbours tie exactly at the `synonym_max_neighbors` cut (then the kNN's tie order, which
    depends on row numbers, decides in both). Cost: one [C, M] GEMM for the C changed phrases, whose
    first rows (the added phrases) also give those rows' top-k, and a kNN for the other affected
    rows only (on the torch backend; another backend searches all affected rows).
    """
    m = len(new_phrases)
    affected = np.zeros(m, dtype=bool)
    affected[added] = True
    k = synonym_candidates_k(cfg, m)
    if backend == "ivf-join":  # the affected rows are few: search them exactly
        backend = "torch"
    changed = torch.cat([new_emb[torch.from_numpy(added)].float(),
                         removed_emb.float()]).to(device)  # [C, D]: the added rows first
    base = new_emb.float().to(device)
    # the added rows are affected whatever the scan finds, and their products with every
    # phrase are the scan's first rows: on the torch backend their top-k is merged from the
    # scan's blocks (vector_search.RunningTopK), so the phrase vectors are read once for them
    fused = RunningTopK(len(added), k, device) if backend == "torch" and len(added) else None
    if changed.shape[0] and m:
        for start in range(0, m, chunk):  # [C, B] per block: the max runs along rows
            sim = changed @ base[start:start + chunk].T
            affected[start:start + chunk] |= \
                (sim.amax(dim=0) >= cfg.synonym_threshold - _AFFECTED_MARGIN).cpu().numpy()
            if fused is not None:
                fused.add(sim[:len(added)], start)
    kept = kept_synonyms(old, to_new, affected)
    rows = np.nonzero(affected)[0]
    if not len(rows):
        return kept, _no_edges(), rows
    if backend == "torch":  # a few rows against all M: column chunks, a running top-k (memory
        # R x (k + chunk)); the added rows' from the scan, the rest (old phrases near a change)
        rest = rows[~np.isin(rows, added)]
        es, ei = np.empty((len(rows), k), np.float32), np.empty((len(rows), k), np.int64)
        parts = [(added, fused.result())] if fused is not None else []
        if len(rest):
            parts.append((rest, exact_topk(base, rest, k, column_chunk=chunk)))
        for part, (part_s, part_i) in parts:  # rows is sorted and holds each part
            at = np.searchsorted(rows, part)
            es[at], ei[at] = part_s, part_i
        scores, ids = torch.from_numpy(es), torch.from_numpy(ei)
    else:  # [B, M] similarities per batch, B from a byte budget (8192 rows at 8.55M phrases
        # would be 280 GB; a commit's affected rows are few, a hub passage's delete many)
        batch = max(1, _KNN_BATCH_BYTES // (4 * max(m, 1)))
        scores, ids = knn(new_emb.float(), k, backend=backend, rows=rows, query_batch=batch)
    fresh = select_synonym_edges(new_phrases, scores, ids, cfg, rows=rows)
    return kept, fresh, rows


# --- approximate synonym kNN at scale ---------------------------------------------------------


def _search_edges(index: AnnIndex, x: np.ndarray, rows: np.ndarray, k: int,
                  eligible: np.ndarray, empty: np.ndarray, cfg: GraphConfig) -> SynonymEdges:
    """The walk over `index`'s neighbours of x[rows]: k0 = 16 candidates first, the full k only
    for the rows whose 16th candidate still clears the threshold (step 2 of
    approximate_synonym_edges)."""
    k0 = min(k, 16)
    s, i = index.search(x[rows], k0)
    more = (s[:, -1] >= cfg.synonym_threshold) & (i[:, -1] >= 0) if k0 < k else \
        np.zeros(len(rows), dtype=bool)
    parts = [_walk(s[~more], i[~more], rows[~more], eligible, empty, cfg)]
    if more.any():
        s2, i2 = index.search(x[rows[more]], k)
        parts.append(_walk(s2, i2, rows[more], eligible, empty, cfg))
    return concat_edges(parts)


def approximate_synonym_edges(
    phrases: list[str], vectors: torch.Tensor, cfg: GraphConfig, *,
    device: torch.device | None = None, kind: str = "hnsw", target_recall: float = 0.97,
    tune_recall: float = 0.85, recall_sample: int = 1000, chunk: int = 65536, seed: int = 0,
    show_progress: bool = False,
) -> tuple[SynonymEdges, dict]:
    """Synonym edges from an approximate kNN (HNSW on CPU, IVF on CUDA: see
    vector_search.AnnIndex), with their recall measured.

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
    if m < 2 or k < 2 or len(rows_all) == 0:
        return _no_edges(), {**info, "recall_vs_exact": 1.0}
    index = AnnIndex(x, kind=kind, cuda=cuda, show_progress=show_progress)
    info.update(index.info)

    def edges_of(rows: np.ndarray) -> SynonymEdges:
        return _search_edges(index, x, rows, k, eligible, empty, cfg)

    sample = np.sort(np.random.default_rng(seed).choice(
        rows_all, min(recall_sample, len(rows_all)), replace=False))
    es, ei = exact_topk(x_t, sample, k)
    exact = _walk(es, ei, sample, eligible, empty, cfg)
    # widen until the sample's own lists reach `tune_recall`; the symmetric union over all
    # phrases' lists (below) then finds most of the rest: a pair is missed only when both of its
    # searches miss it, about (1 - r)^2 for a one-sided recall r (measured on 256k synthetic
    # phrases, IVF: one-sided 0.80 / 0.87 / 0.91 at nprobe 8 / 16 / 32, symmetric >= 0.98 at 16)
    while edge_recall(edges_of(sample), exact) < tune_recall and index.widen():
        pass
    while True:
        parts = []
        with progress(total=len(rows_all), desc="synonym kNN: search", unit="phrase",
                      disable=not show_progress) as bar:
            for start in range(0, len(rows_all), chunk):
                parts.append(edges_of(rows_all[start:start + chunk]))
                bar.update(min(chunk, len(rows_all) - start))
        edges = symmetrize_synonym_edges(concat_edges(parts), eligible,
                                         cfg.synonym_max_neighbors)
        recall = sample_recall(edges, sample, exact, m)
        if recall >= target_recall or not index.widen():
            break
    info.update({index.name: index.value}, recall_vs_exact=round(recall, 4),
                recall_sample=int(len(sample)), recall_edges=int(len(exact.src)))
    return edges, info


def _choose_probes(x: torch.Tensor, cent: torch.Tensor, tune_exact: SynonymEdges,
                   eligible: np.ndarray, width: int,
                   target_recall: float) -> tuple[int, np.ndarray | None]:
    """Step 2 of join_synonym_edges, on `cent` [nlist, D]: (p, the probes at which the
    symmetric join finds `target_recall` of the tune sample's exact edges, at most `width`;
    the probes each of those edges needs). When the sample has no exact edge there is nothing
    to tune on: (min(8, nlist), None)."""
    if not len(tune_exact.src):
        return min(8, cent.shape[0]), None
    t_rows = np.unique(np.concatenate([tune_exact.src, tune_exact.dst]))
    row_of = {int(r): i for i, r in enumerate(t_rows.tolist())}
    t_probes = nearest_lists(x[torch.from_numpy(t_rows).to(x.device)], cent, width).numpy()
    need = probes_needed(tune_exact.src, tune_exact.dst, t_probes, row_of,
                         eligible[tune_exact.dst])
    found = np.sort(need)
    at = int(math.ceil(target_recall * len(found))) - 1  # the target-quantile pair
    return (int(found[at]) if np.isfinite(found[at]) else width), need


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
    if m < 2 or len(rows_all) == 0:
        return _no_edges(), {**info, "recall_vs_exact": 1.0}
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
    p, need = _choose_probes(x, cent, tune_exact, eligible, min(max_probes, nl), target_recall)
    if need is not None:
        info["probes_needed"] = {q: float(np.quantile(need, q / 100)) for q in (50, 90, 99)}
    probes = nearest_lists(x, cent, p, show_progress=show_progress)
    s, d, sc = threshold_join(x, probes, rows_all, thr, show_progress=show_progress)
    del probes
    keep = (s != d) & ~empty[d]
    edges = symmetrize_synonym_edges(SynonymEdges(s[keep], d[keep], sc[keep]), eligible,
                                     cfg.synonym_max_neighbors)

    held_exact = exact_edges(held) if len(held) else _no_edges()
    info.update(nlist=nl, nprobe=p, device=str(dev),
                recall_vs_exact=round(sample_recall(edges, held, held_exact, m), 4),
                recall_tune=round(sample_recall(edges, tune, tune_exact, m), 4),
                recall_sample=int(len(held)), recall_edges=int(len(held_exact.src)))
    return edges, info


# --- the entry point ---------------------------------------------------------------------------


def synonym_edges(
    phrases: list[str], vectors: torch.Tensor, cfg: GraphConfig, device: torch.device, *,
    show_progress: bool = False,
) -> tuple[SynonymEdges, dict[str, Any]]:
    """The synonym edges of `phrases`, by the strategy `cfg.knn_backend` resolves to.

    The backend is `resolve_knn_backend(cfg.knn_backend, device, M)`. "ivf-join":
    `join_synonym_edges`;
    "faiss-hnsw" / "faiss-ivf": `approximate_synonym_edges`; an exact backend: `knn` for
    `synonym_candidates_k` neighbours, then `select_synonym_edges` (recall 1.0).

    Args:
        phrases: [M] normalised phrase texts.
        vectors: [M, D] unit phrase vectors (CPU; the torch paths move them to `device`).
        device: where the torch GEMMs run.

    Returns:
        (edges in phrase rows, info): info is the build report's "synonym_knn" entry: backend
        and k, plus what the strategy reports (recall_vs_exact, recomputed_phrases, ...).
    """
    m = len(phrases)
    backend = resolve_knn_backend(cfg.knn_backend, device, m)
    k = synonym_candidates_k(cfg, m)
    info: dict[str, Any] = {"backend": backend, "k": k}
    if backend == "ivf-join":
        edges, info = join_synonym_edges(phrases, vectors, cfg, device=device,
                                         show_progress=show_progress)
        log.info("approximate synonym kNN (ivf-join): edge recall vs exact = %.4f on %d "
                 "held-out phrases", info["recall_vs_exact"], info["recall_sample"])
        return edges, info
    if backend in APPROXIMATE_BACKENDS:
        edges, info = approximate_synonym_edges(
            phrases, vectors, cfg, device=device,
            kind="ivf" if backend == "faiss-ivf" else "hnsw", show_progress=show_progress)
        log.info("approximate synonym kNN (%s): edge recall vs exact = %.4f on %d phrases",
                 info["backend"], info["recall_vs_exact"], info.get("recall_sample", 0))
        return edges, info
    scores, ids = knn(vectors.to(device) if backend == "torch" else vectors, k, backend=backend)
    info["recall_vs_exact"] = 1.0
    return select_synonym_edges(phrases, scores, ids, cfg), info
