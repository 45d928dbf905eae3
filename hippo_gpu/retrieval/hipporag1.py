"""HippoRAG 1 (legacy) retrieval, batched: query entities -> nearest phrase -> PPR on the
phrase graph -> passage scores.

Semantics (OSU-NLP-Group/HippoRAG `legacy` branch: src/create_graph.py builds the graph,
src/hipporag.py `build_graph`, `link_node_by_dpr`, `rank_docs` query it). Shapes: M
phrases, P passages, F facts, Q queries.

Graph. Nodes are the M phrase rows only (v1's `np.unique` of the normalised subjects and
objects: the index's phrase rows). create_graph.py fills a dict of ordered-pair statistics:

    S[(s, o)] += 1 and S[(o, s)] += 1   for every occurrence of a triple (s, p, o)
    S[(u, v)]  = 1.0 * cos(u, v)        for every accepted synonym neighbour v of u (this
                                        assignment overwrites the count of that orientation)

`build_graph` dedups with a set of *ordered* pairs, which are already unique dict keys, so
the set removes nothing but self-loops (u = v); each remaining key becomes one undirected
igraph edge of weight S[(u, v)]. Both orientations of a fact pair are keys, so the graph is a
multigraph and PPR (undirected, weighted) walks the symmetric sum

    W[u, v] = S[(u, v)] + S[(v, u)]                                                    (1)

A deduplicated fact edge therefore weighs 2c in W (c = occurrences of triples joining u and
v), mutual synonyms s_uv + s_vu, a fact pair with one synonym orientation c + s_uv, a one-way
synonym s_uv. These are the statistics of the HippoRAG 2 graph (indexing/graph.py) restricted to
phrase pairs, so W equals the phrase block of `Index.adjacency` (see `build_v1_graph` for how
it is recovered in float64).

Linking. Each query entity is normalised like a phrase (v1's `processing_phrases`), embedded
and linked to its single nearest phrase, e(t) = argmax_e cos(t, e) (first maximum, as
`np.argmax`). The reset vector is r[e, q] = 1 / |docs(e)| for each linked phrase e of query q
("node specificity"; 1 where |docs(e)| = 0), written by assignment, so an entity linked twice
counts once.

PPR. x[:, q] = PPR_d(W, r[:, q]) with igraph prpack semantics (ppr/iteration.py), d =
`RetrievalConfig.damping` (0.5, as v1's README runs; v1's constructor default is 0.1).

Passages. With D [P, F] the binary passage-fact incidence (`docs_to_facts_mat`) and
FP [F, M] the binary fact-phrase incidence (`facts_to_phrases_mat`),

    score[q] = minmax(D (FP x[:, q])) = minmax(B x[:, q]),   B = D FP  [P, M]            (2)

so B[p, e] is the number of distinct facts stated in passage p that have e as subject or
object (a fact whose subject is its object counts once). minmax(y) = (y - min) / (max - min).
A query without entities scores 1/P everywhere (v1's uniform `ppr_doc_prob`), not the dense
ranking. Rankings are by score descending, ties by the lower passage row.

Batching. One GEMM links all entities of all queries (in blocks of phrase rows when [E, M]
outgrows RetrievalConfig.chunk_bytes); the reset vectors of the queries that have entities form
one [M, Q'] matrix and one PPR solve serves them all; (2) is one sparse [P, M] x [M, Q']
product. hippo_gpu.retrieval.searcher calls `passage_scores` once per chunk of queries, so [M, Q']
and [Q', P] stay within the chunk budget; a query's scores do not depend on its chunk. The graph, B
and the specificities are built once per Searcher from stored data (the fact counts are solved from
the adjacency, the synonyms are stored).

Relation to legacy code, and what differs (each unavoidable from an index, or chosen):
  * Encoder: linking and synonym kNN use the index's encoder (default all-MiniLM-L6-v2), not
    v1's Contriever (mean pooling) or ColBERTv2; which phrases link and which synonym edges
    exist depend on it. The index fixes its encoder, so this is unavoidable.
  * docs_to_facts: D is exact, from the normalised triples each passage states (the index
    stores them for its writer: `Index.passage_triples`). For an in-memory index without them
    D is derived as D'[p, f] = [p mentions s_f] * [p mentions o_f], a superset of D (a passage
    that mentions both ends of a fact stated elsewhere gains it; musique_train: 821 extra pairs
    on 17,204, in 273 of 1,890 passages).
  * Fact counts: v1 counts every occurrence of a triple, including exact repeats inside one
    passage; the index (like HippoRAG 2's filter) keeps a repeated triple once, so from the
    index alone c is lower on such pairs (musique_train: 30 repeats on 24 pairs). Given the
    OpenIE docs (`build_v1_graph(index, openie_docs=...)`) the repeats are counted as v1 counts
    them (`fact_repeats`). Measured on musique_train with the official run's query entities
    (tests/retrieval/test_hipporag1_official.py): with the docs every top-10 list equals the
    legacy run's up to ties; from the index alone recall is the same at every k but 5 of 100
    top-10 lists order passages differently, each around a pair with a repeated triple.
    v1 also keeps 3-element triples with a blank or non-string element (str() of it), which
    the index drops as malformed (musique_train: none; its 185 malformed triples have the
    wrong arity, which v1 drops too).
  * Synonyms: v1 asks an exact FAISS kNN for k = 2047; we ask k = min(2047, 103, M), which gives
    the same walk (indexing/synonyms.py). v1's walk would accept an empty-phrase neighbour (ours
    skips it), but its phrase list passes a pandas TSV round trip that reads "" and "null" as NaN,
    i.e. the string "nan": "" then never matches a phrase (skipped, as ours), a phrase "null" gets
    no synonym edges, and both are embedded as "nan". We keep "null" and "nan" ordinary phrases;
    musique_train has "" but neither of the others, so its edges agree. Exact score ties at the
    101-neighbour cap are ordered by v1's reversed stable argsort, here by faiss. If the float64
    rebuild of W does not round to the stored float32 block, the stored block is used as it is
    (V1Graph.weights says which).
  * Ties in the ranking: v1 sorts `np.argsort(doc_prob, kind='mergesort')[::-1]`, which puts
    tied passages in *descending* row order (and a query without entities in rows P-1..0);
    we break ties by the lower row, the project's convention.
  * minmax with zero range: v1 divides 0 by 0 (NaN scores); we return all ones (as
    search.minmax_rows does).
  * PPR: prpack solves to ~1e-10 (Gauss-Seidel; dense elimination below 128 nodes); ours
    iterates to `RetrievalConfig.ppr_tol` (an L1 bound; 1e-11 in float64 by default).
  * Not reproduced: v1's `doc_ensemble` (blend with dense scores below a linking-confidence
    threshold; off by default), `dpr_only`, graph_alg other than "ppr", node_specificity off.
    Query NER is the caller's (an LLM through hippo_gpu.llm.ner, a HippoRAG NER file, or
    capitalised spans).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from hippo_gpu.data import OpenIEDoc
from hippo_gpu.indexing.graph import normalize_text
from hippo_gpu.indexing.index import Index
from hippo_gpu.indexing.synonyms import (
    SynonymEdges,
)
from hippo_gpu.ppr import PPRSolution, PPRSolver
from hippo_gpu.retrieval.blockwise import nearest_rows
from hippo_gpu.retrieval.ranking import minmax_rows

__all__ = [
    "V1Graph",
    "build_v1_graph",
    "derived_passage_facts",
    "fact_repeats",
    "flatten_entities",
    "link_entities",
    "passage_facts_from_openie",
    "passage_scores",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class V1Graph:
    """The legacy-v1 query structures of one index (built once, read by every query).

    Attributes:
        adjacency: [M, M] sparse CSR float64, symmetric: W of eq. (1).
        passage_phrase: [P, M] sparse CSR float64: B = D FP of eq. (2).
        specificity: [M] float64 reset weight 1 / |docs(e)| (1 where 0).
        weights: "reconstructed" (W rebuilt in float64 from the index, equal to the stored
            float32 adjacency after rounding) or "stored-float32" (the index's float32 phrase
            block, used when the rebuild cannot be checked against it).
        passage_facts: "openie" (D and v1's repeat counts from the OpenIE docs: the legacy
            graph exactly), "exact" (D from the stored per-passage facts, repeats counted once)
            or "derived" (D' from incidences).
        synonym_pairs: directed synonym assignments in W ("reconstructed" only, else -1).
    """

    adjacency: Tensor
    passage_phrase: Tensor
    specificity: Tensor
    weights: str
    passage_facts: str
    synonym_pairs: int

    @property
    def num_phrases(self) -> int:
        return int(self.adjacency.shape[0])

    @property
    def num_passages(self) -> int:
        return int(self.passage_phrase.shape[0])


def _csr64(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, shape: tuple[int, int],
           device: torch.device) -> Tensor:
    """float64 sparse CSR of `shape`, duplicate (row, col) entries summed."""
    coo = torch.sparse_coo_tensor(
        torch.from_numpy(np.stack([rows, cols]).astype(np.int64)).reshape(2, -1),
        torch.from_numpy(np.asarray(vals, dtype=np.float64)), shape, check_invariants=False)
    return coo.coalesce().to_sparse_csr().to(device)


def _stored_phrase_block(index: Index, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Upper triangle (u < v) of the phrase block of the stored adjacency: (keys u*M+v, float32).

    Phrase rows come first (0..M-1); passage-phrase edges only touch rows >= M.
    """
    adj = index.adjacency.to("cpu")
    crow = adj.crow_indices().numpy()
    col = adj.col_indices().numpy()
    val = adj.values().to(torch.float32).numpy()
    row = np.repeat(np.arange(len(crow) - 1), np.diff(crow))
    keep = (row < m) & (col < m) & (row < col)
    return row[keep].astype(np.int64) * m + col[keep], val[keep]


def _stored_synonyms(index: Index) -> SynonymEdges:
    """The synonym assignments the build accepted, as the index stores them (phrase rows)."""
    return SynonymEdges(index.synonym_src.cpu().numpy().astype(np.int64),
                        index.synonym_dst.cpu().numpy().astype(np.int64),
                        index.synonym_score.cpu().float().numpy())


def _phrase_weights(index: Index, repeats: tuple[np.ndarray, np.ndarray] | None = None
                    ) -> tuple[np.ndarray, np.ndarray, str, int]:
    """W of eq. (1) as (upper-triangle keys u*M+v, float64 weights), and its source.

    `repeats` (keys u*M+v, extra occurrences), from `fact_repeats`, adds to each fact pair's
    count c the exact repeats of its triples that the index dropped on read (eq. 1 with v1's
    counts); without it c is the index's count.

    The index's phrase block holds A[u, v] = S[(u, v)] + S[(v, u)] in float32, with S built
    from the fact counts and the synonym scores as v1 builds it (overwrite) or, with
    GraphConfig.synonym_overwrites_facts False, added to the counts. We take the stored
    synonym assignments, the fact pairs from `fact_phrases`, solve each fact pair's count c (an
    integer) from A, and rebuild W with v1's overwrite rule in float64. The rebuild must
    reproduce the stored A bit for bit after rounding to float32, else the float32 block is
    used as it is (then W carries ~1e-7 relative rounding).
    """
    m = len(index.phrases)
    a_key, a_val = _stored_phrase_block(index, m)
    stored = (a_key, a_val.astype(np.float64), "stored-float32", -1)
    syn = _stored_synonyms(index)
    fp = index.fact_phrases.cpu().numpy().reshape(-1, 2)
    off = fp[:, 0] != fp[:, 1]  # a self pair is a self-loop, dropped by build_graph
    f_key = np.unique(np.minimum(fp[off, 0], fp[off, 1]) * m + np.maximum(fp[off, 0], fp[off, 1]))
    lo, hi = np.minimum(syn.src, syn.dst), np.maximum(syn.src, syn.dst)
    s_key = lo * m + hi
    keys = np.unique(np.concatenate([a_key, f_key, s_key]))
    a = np.zeros(len(keys), dtype=np.float32)
    a[np.searchsorted(keys, a_key)] = a_val
    is_fact = np.zeros(len(keys), dtype=bool)
    is_fact[np.searchsorted(keys, f_key)] = True
    # the lower->higher (fwd) and higher->lower (bwd) orientations of each pair
    fwd = syn.src < syn.dst
    pos = np.searchsorted(keys, s_key)
    has_f = np.zeros(len(keys), dtype=bool)
    has_b = np.zeros(len(keys), dtype=bool)
    s_f = np.zeros(len(keys))
    s_b = np.zeros(len(keys))
    has_f[pos[fwd]] = True
    s_f[pos[fwd]] = syn.score[fwd]
    has_b[pos[~fwd]] = True
    s_b[pos[~fwd]] = syn.score[~fwd]

    overwrite = index.config.graph.synonym_overwrites_facts
    if overwrite:  # A = (s_f or c) + (s_b or c)
        free = (~has_f).astype(np.int64) + (~has_b).astype(np.int64)
    else:  # A = (c + s_f) + (c + s_b)
        free = np.full(len(keys), 2, dtype=np.int64)
    solvable = is_fact & (free > 0)
    c_est = np.where(solvable, (a.astype(np.float64) - s_f - s_b) / np.maximum(free, 1), 0.0)
    c = np.where(solvable, np.rint(c_est), np.where(is_fact, 1.0, 0.0))
    counts_ok = bool(np.all(~solvable | ((c >= 1) & (np.abs(c_est - c) <= 1e-3))))
    cf = np.where(is_fact, c, 0.0)
    if overwrite:  # the index's own A, summed in build_graph's order
        a_index = np.where(has_f, s_f, cf) + np.where(has_b, s_b, cf)
    else:
        a_index = (cf + s_f) + (cf + s_b)
    if not (counts_ok and np.array_equal(a_index.astype(np.float32), a)):
        log.warning("hipporag1: rebuilt phrase weights differ from the stored adjacency; "
                    "using the stored float32 phrase weights")
        return stored
    if repeats is not None and len(repeats[0]):
        at = np.searchsorted(keys, repeats[0])
        if not (np.all(at < len(keys)) and np.array_equal(keys[np.minimum(at, len(keys) - 1)],
                                                          repeats[0]) and is_fact[at].all()):
            raise ValueError("hipporag1: a repeated triple's phrase pair is not a fact pair "
                             "of this index (OpenIE docs of another index?)")
        cf = cf.copy()
        cf[at] += repeats[1]
    w = np.where(has_f, s_f, cf) + np.where(has_b, s_b, cf)  # v1: overwrite, eq. (1)
    keep = w != 0
    return keys[keep], w[keep], "reconstructed", int(len(syn.src))


def derived_passage_facts(index: Index) -> tuple[np.ndarray, np.ndarray]:
    """D' as (passage rows, fact rows): the facts whose subject and object a passage mentions.

    A superset of the true passage-fact incidence D (see the module docstring). Vectorised:
    for each fact, the passages of its subject are checked against the (object, passage)
    incidence keys by binary search.
    """
    m, p = len(index.phrases), len(index.passage_keys)
    inc_e = index.incidence_phrase.cpu().numpy().astype(np.int64)
    inc_p = index.incidence_passage.cpu().numpy().astype(np.int64)
    fp = index.fact_phrases.cpu().numpy().reshape(-1, 2).astype(np.int64)
    if fp.shape[0] == 0 or inc_e.size == 0:
        z = np.zeros(0, dtype=np.int64)
        return z, z
    order = np.lexsort((inc_p, inc_e))  # by phrase, then passage
    e_sorted, p_sorted = inc_e[order], inc_p[order]
    ptr = np.searchsorted(e_sorted, np.arange(m + 1))  # [M + 1] phrase -> its passages
    s, o = fp[:, 0], fp[:, 1]
    deg = ptr[s + 1] - ptr[s]  # [F] passages mentioning the subject
    fact = np.repeat(np.arange(len(fp)), deg)
    within = np.arange(int(deg.sum())) - np.repeat(np.cumsum(deg) - deg, deg)
    cand = p_sorted[np.repeat(ptr[s], deg) + within]
    inc_key = np.unique(inc_e * max(p, 1) + inc_p)
    want = o[fact] * max(p, 1) + cand
    at = np.minimum(np.searchsorted(inc_key, want), len(inc_key) - 1)
    hit = inc_key[at] == want
    return cand[hit], fact[hit]


def stored_passage_facts(index: Index) -> tuple[np.ndarray, np.ndarray]:
    """Exact D as (passage rows, fact rows) from the per-passage triples the index stores."""
    row = {f: j for j, f in enumerate(index.facts)}
    pairs = {(pi, row[t]) for pi, ts in enumerate(index.passage_triples) for t in ts}
    arr = np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]


def passage_facts_from_openie(index: Index, docs: Sequence[OpenIEDoc]) -> tuple[np.ndarray,
                                                                                 np.ndarray]:
    """Exact D as (passage rows, fact rows) from the OpenIE docs the index was built from.

    Args:
        docs: one OpenIEDoc per index passage, in passage-row order (data.read_openie with the
            index's corpus gives exactly that).
    """
    if len(docs) != len(index.passage_keys):
        raise ValueError(f"{len(docs)} OpenIE docs for {len(index.passage_keys)} passages")
    row = {f: j for j, f in enumerate(index.facts)}
    pairs: set[tuple[int, int]] = set()
    for pi, doc in enumerate(docs):
        for s, r, o in doc.triples:
            t = (normalize_text(s), normalize_text(r), normalize_text(o))
            j = row.get(t)
            if j is None:
                raise ValueError(f"passage row {pi}: fact {t!r} is not in the index "
                                 "(OpenIE docs of another index?)")
            pairs.add((pi, j))
    arr = np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]


def fact_repeats(index: Index, docs: Sequence[OpenIEDoc]) -> tuple[np.ndarray, np.ndarray]:
    """The exact triple repeats the index dropped, as (fact pair keys u*M+v with u < v, extra
    occurrences) per pair: v1's create_graph.py adds 1 to S[(s, o)] and S[(o, s)] for every
    occurrence of a triple, so a triple stated k times in one passage adds k - 1 to its pair's
    count c beyond the index's (OpenIEDoc.raw_counts). Self pairs (s = o) are loops, dropped.

    Args:
        docs: one OpenIEDoc per index passage, in passage-row order.
    """
    if len(docs) != len(index.passage_keys):
        raise ValueError(f"{len(docs)} OpenIE docs for {len(index.passage_keys)} passages")
    m = len(index.phrases)
    row = index.row_of_phrase
    extra: dict[int, int] = {}
    for doc in docs:
        for (s, _, o), k in zip(doc.triples, doc.repeat_counts()):
            u, v = row[normalize_text(s)], row[normalize_text(o)]
            if k > 1 and u != v:
                key = min(u, v) * m + max(u, v)
                extra[key] = extra.get(key, 0) + k - 1
    keys = np.array(sorted(extra), dtype=np.int64)
    return keys, np.array([extra[k] for k in keys.tolist()], dtype=np.float64)


def build_v1_graph(index: Index, *, openie_docs: Sequence[OpenIEDoc] | None = None) -> V1Graph:
    """The legacy-v1 structures of `index`: W (eq. 1), B = D FP (eq. 2), specificities.

    Args:
        openie_docs: the OpenIE docs the index was built from, one per passage in passage-row
            order (data.read_openie with the index's corpus). With them D is exact
            (`passage_facts_from_openie`) and W counts every exact repeat of a triple inside
            a passage, as v1 does (`fact_repeats`): the legacy graph exactly. Without them
            (what a Searcher has) D is the exact D of the index's stored per-passage triples
            (`stored_passage_facts`), or D' (`derived_passage_facts`) for an index that holds
            none, and W counts a repeated triple once.
    """
    m, p = len(index.phrases), len(index.passage_keys)
    dev = index.device
    repeats = None if openie_docs is None else fact_repeats(index, openie_docs)
    w_key, w_val, weights, n_syn = _phrase_weights(index, repeats)
    u, v = w_key // max(m, 1), w_key % max(m, 1)
    adjacency = _csr64(np.concatenate([u, v]), np.concatenate([v, u]),
                       np.concatenate([w_val, w_val]), (m, m), dev)

    if openie_docs is not None:
        pas, fac = passage_facts_from_openie(index, openie_docs)
        source = "openie"
    elif len(index.passage_triples) == p:
        pas, fac = stored_passage_facts(index)
        source = "exact"
    else:
        pas, fac = derived_passage_facts(index)
        source = "derived"
    pairs = np.unique(pas * max(len(index.facts), 1) + fac)  # D is binary
    pas, fac = pairs // max(len(index.facts), 1), pairs % max(len(index.facts), 1)
    fp = index.fact_phrases.cpu().numpy().reshape(-1, 2).astype(np.int64)
    s, o = fp[fac, 0], fp[fac, 1]
    two = s != o  # FP is binary: a fact whose subject is its object has one phrase entry
    passage_phrase = _csr64(np.concatenate([pas, pas[two]]), np.concatenate([s, o[two]]),
                            np.ones(len(pas) + int(two.sum())), (p, m), dev)

    counts = index.phrase_passage_counts.to(dev, torch.float64)
    specificity = torch.where(counts > 0, 1.0 / counts.clamp_min(1), torch.ones_like(counts))
    return V1Graph(adjacency=adjacency, passage_phrase=passage_phrase, specificity=specificity,
                   weights=weights, passage_facts=source, synonym_pairs=n_syn)


def flatten_entities(query_entities: Sequence[Sequence[str]]) -> tuple[list[str], list[int]]:
    """Normalised entity texts of all queries (v1's processing_phrases) and their query rows."""
    texts = [normalize_text(e) for ents in query_entities for e in ents]
    owner = [qi for qi, ents in enumerate(query_entities) for _ in ents]
    return texts, owner


def link_entities(entity_emb: Tensor, phrase_emb: Tensor,
                  block_rows: int | None = None) -> Tensor:
    """[E, D] entity vectors x [M, D] phrase vectors -> [E] int64 nearest phrase rows.

    argmax of the cosine (rows are L2-normalised), the first maximum on ties (as np.argmax).
    `block_rows` phrase rows at a time (default all): never more than [E, block_rows] scores
    (hippo_gpu.retrieval.blockwise.nearest_rows; the same rows for any blocking).
    """
    return nearest_rows(entity_emb, phrase_emb, block_rows)


def passage_scores(graph: V1Graph, solver: PPRSolver, phrase_rows: Tensor, owner: Tensor,
                   num_queries: int) -> tuple[Tensor, Tensor, PPRSolution | None]:
    """Eq. (2) for a batch: linked phrases -> reset vectors -> one PPR solve -> passage scores.

    Args:
        phrase_rows: [E] linked phrase row of each entity (link_entities).
        owner: [E] query row of each entity.
        num_queries: Q.

    Returns:
        scores: [Q, P] in the solver's dtype; a query without entities scores 1/P everywhere.
        has_entities: [Q] bool.
        solution: the PPR solve, one column per query with entities in row order (None when
            no query has one); an uncertified column leaves its query's scores uncertified.
    """
    dev, dtype = graph.specificity.device, solver.dtype
    m, p = graph.num_phrases, graph.num_passages
    owner = owner.to(dev)
    has = torch.zeros(num_queries, dtype=torch.bool, device=dev)
    if m > 0:
        has[owner] = True
    scores = torch.full((num_queries, p), 1.0 / max(p, 1), dtype=dtype, device=dev)
    if not bool(has.any()):
        return scores, has, None
    cols = torch.nonzero(has).flatten()  # [Q'] queries with entities
    col_of = torch.cumsum(has.to(torch.int64), 0) - 1  # query row -> its column in [M, Q']
    rows = phrase_rows.to(dev)
    seeds = torch.zeros((m, cols.numel()), dtype=torch.float64, device=dev)
    # assignment, as v1: a phrase linked by two entities of a query keeps one weight
    seeds[rows, col_of.index_select(0, owner)] = graph.specificity.index_select(0, rows)
    solution = solver.solve(seeds)
    x = solution.scores  # [M, Q'] PPR of the phrase graph, columns sum to 1
    # [Q', P] = (D (FP x))ᵀ, one sparse matrix-vector product per column: MKL's sparse x dense
    # product sums in an order that depends on the number of columns (measured on AVX-512), so
    # a query's scores would depend on its chunk; column by column they do not
    incidence = graph.passage_phrase.to(dtype)
    doc = torch.stack([incidence @ x[:, j] for j in range(x.shape[1])])
    scores[cols] = minmax_rows(doc)  # a zero-range row becomes all ones (v1: NaN)
    return scores, has, solution
