"""The hybrid mode's own parts: the reciprocal-rank fusion, and the entity ranking it fuses in.

hybrid = PPR seeded like HippoRAG 2 (phrase seeds normalised, a softmax passage prior), fused
by weighted reciprocal rank with the dense ranking and HippoRAG 1's idea of an entity ranking:
each query entity is linked to a phrase, the phrase seeds a specificity-weighted PPR on the
phrase block of the index graph, and a passage scores the PPR mass of the phrases it mentions.
The Searcher (hippo_gpu.retrieval.searcher) owns the caches these functions take (the encoder, the
phrase graph's solver, the incidence matrix) and calls them per batch and per chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from hippo_gpu.config import RetrievalConfig
from hippo_gpu.indexing.index import Index
from hippo_gpu.ppr import PPRSolution, PPRSolver
from hippo_gpu.retrieval.blockwise import nearest_rows
from hippo_gpu.retrieval.ranking import minmax_rows, ranks_of
from hippo_gpu.retrieval.seeds import plan_chunks

__all__ = ["entity_doc", "fusion_ranks", "fusion_terms", "hybrid_fusion", "link_entities",
           "passage_phrase_incidence"]


def hybrid_fusion(ppr: Tensor, cos: Tensor, cfg: RetrievalConfig,
                  entity: tuple[Tensor, Tensor] | None) -> Tensor:
    """Weighted reciprocal-rank fusion of three rankings of the passages ([c, P] each):

        score = (1 - e) w / (k + rank_ppr) + (1 - e)(1 - w) / (k + rank_dense)
                + e / (k + rank_entity)

    with w = hybrid_weight, e = hybrid_entity_weight, k = hybrid_rrf_k, ranks from 0 (the terms:
    `fusion_terms`; the ranks: `fusion_ranks`).
    """
    ppr_term, dense_term, entity_term = fusion_terms(fusion_ranks(ppr, cos, cfg, entity), cfg)
    final = ppr_term + dense_term
    return final if entity_term is None else final + entity_term


def fusion_ranks(ppr: Tensor, cos: Tensor, cfg: RetrievalConfig,
                 entity: tuple[Tensor, Tensor] | None
                 ) -> tuple[Tensor, Tensor, Tensor | None]:
    """The 0-based int64 ranks [c, P] of every passage in the PPR, dense and entity rankings
    (None: no entity ranking, e = 0 or `entity` None). The entity ranking is `entity_doc`'s
    (`entity` = its (scores, has_entities) for these queries); passages it scores 0 rank last,
    and a query with no entity uses its dense ranking there."""
    rank_dense = ranks_of(cos)
    rank_ent = None
    if cfg.hybrid_entity_weight > 0 and entity is not None:
        doc, has_ent = entity
        rank_ent = ranks_of(doc).masked_fill(doc <= 0, doc.shape[1])
        rank_ent = torch.where(has_ent.unsqueeze(1), rank_ent, rank_dense)
    return ranks_of(ppr), rank_dense, rank_ent


def fusion_terms(ranks: tuple[Tensor, Tensor, Tensor | None], cfg: RetrievalConfig
                 ) -> tuple[Tensor, Tensor, Tensor | None]:
    """The float64 reciprocal-rank terms of `fusion_ranks`' ranks (the score is their sum, in
    this order): float64 fusion of exact integer ranks, so no rounding collapses two ranks for
    any P."""
    w, e, k = cfg.hybrid_weight, cfg.hybrid_entity_weight, cfg.hybrid_rrf_k
    rank_ppr, rank_dense, rank_ent = ranks
    ppr_term = (1 - e) * w / (k + rank_ppr.double())
    dense_term = (1 - e) * (1 - w) / (k + rank_dense.double())
    return ppr_term, dense_term, None if rank_ent is None else e / (k + rank_ent.double())


def link_entities(index: Index, query_entities: Sequence[Sequence[str]], cfg: RetrievalConfig,
                  encode: Callable[[list[str]], Tensor], uncased: bool) -> tuple[Tensor, Tensor]:
    """(phrase row [E], query row [E]) of every entity of a batch.

    With an encoder verified uncased (``uncased``), an entity whose lower-cased text is a
    phrase links to it without encoding (its vector is the phrase's: exactly the cosine argmax);
    every other entity goes to the nearest phrase by cosine (``encode`` gives [E', D] vectors),
    in blocks of phrase rows.
    """
    dev = index.device
    owner = [qi for qi, ents in enumerate(query_entities) for _ in ents]
    flat = [e for ents in query_entities for e in ents]
    if not flat or len(index.phrases) == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=dev)
        return empty, empty
    row_of = index.row_of_phrase if uncased else {}
    exact = [row_of.get(e.lower(), -1) for e in flat]
    todo = [i for i, r in enumerate(exact) if r < 0]
    nearest = torch.tensor(exact, dtype=torch.int64, device=dev)  # [E] phrase rows
    if todo:
        e_ent = encode([flat[i] for i in todo])
        rows = plan_chunks(index, 0, cfg, num_entities=len(todo)).phrase_rows
        nearest[torch.tensor(todo, device=dev)] = nearest_rows(e_ent, index.phrase_emb, rows)
    return nearest, torch.tensor(owner, dtype=torch.int64, device=dev)


def entity_doc(index: Index, solver: PPRSolver, incidence: Tensor, nearest: Tensor,
               owner: Tensor, start: int, stop: int,
               cfg: RetrievalConfig) -> tuple[Tensor, Tensor, PPRSolution | None]:
    """The entity ranking of queries start..stop-1 from the linked entities of the batch.

    Each linked phrase gets reset weight 1 / |passages containing it| (node specificity), PPR
    runs on the phrase graph (``solver``), and a passage scores the sum of the PPR of the
    phrases it mentions (``incidence``: binary passage-phrase, where legacy v1 weights a phrase
    by the facts of the passage that name it), min-max normalised per query.

    Returns ([c, P] float32 scores, zero for queries without entities; [c] has_entities; the
    phrase-graph PPR solution of the c columns, those of queries without entities being
    placeholders, or None when no query has one), c = stop - start.
    """
    dev = index.device
    q, m, p = stop - start, len(index.phrases), len(index.passage_keys)
    mine = (owner >= start) & (owner < stop)
    nearest, own = nearest[mine], owner[mine] - start
    has_ent = torch.zeros(q, dtype=torch.bool, device=dev)
    if nearest.numel() == 0 or m == 0:
        return torch.zeros((q, p), device=dev), has_ent, None
    weight = 1.0 / index.phrase_passage_counts.index_select(0, nearest).clamp_min(1).double()
    seeds = torch.zeros((m, q), dtype=solver.dtype, device=dev)  # [M, c]
    seeds.index_put_((nearest, own), weight.to(solver.dtype))  # assignment, as upstream
    has_ent[own] = True
    seeds[:, ~has_ent] = 1.0  # placeholder for queries without entities; zeroed below
    solution = solver.solve(seeds)
    del seeds
    ppr = solution.scores  # [M, c]
    doc = minmax_rows((incidence @ ppr).T.float())  # [c, P]
    return doc * has_ent.unsqueeze(1), has_ent, solution


def passage_phrase_incidence(index: Index, dtype: torch.dtype) -> Tensor:
    """[P, M] binary passage-phrase incidence as sparse CSR."""
    return torch.sparse_coo_tensor(
        torch.stack([index.incidence_passage, index.incidence_phrase]),
        torch.ones(index.incidence_phrase.numel(), dtype=dtype, device=index.device),
        (len(index.passage_keys), len(index.phrases)), check_invariants=False,
    ).to_sparse_csr()
