"""What `Searcher.explain` returns: per query its seeds, and per hit its score split into one term
per seed, one for the dense passage prior and (HippoRAG 1) the min-max shift, with the bound
the split is certified to (the decomposition itself is hippo_gpu.retrieval.explain). Plain frozen
dataclasses, and one JSON form (`explanation_dict`) that the server, the MCP tool and the batch
job all write.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hippo_gpu.data import Triple
from hippo_gpu.retrieval.results import Hit, label_fields

__all__ = ["Bridge", "DensePrior", "Fusion", "HitExplanation", "PhraseInfo", "QueryExplanation",
           "Seed", "SeedContribution", "SeedFact", "explanation_dict"]


@dataclass(frozen=True)
class SeedFact:
    """A kept fact of the query: what seeds its two phrases."""

    row: int  # fact row in the index
    fact: Triple  # (subject, predicate, object), normalised
    score: float  # min-max scaled query-fact cosine s_f over all facts


@dataclass(frozen=True)
class Seed:
    """One phrase node of a query's reset vector.

    ``weight`` is its entry r_s of the reset vector as the mode builds it (hipporag2: the mean
    of s_f / |passages of the phrase| over its kept facts; hybrid: that, normalised over the
    query's seeds; hipporag1: 1 / |passages of the phrase|), before PPR divides r by its sum.
    ``share`` = r_s c_s / cᵀr is the fraction of the query's whole PPR mass that starts here
    (hippo_gpu.retrieval.explain, eq. E1): the shares of the seeds and the dense prior sum to 1.
    """

    phrase: str
    node: int  # node row (phrase rows come first, so also the phrase row)
    weight: float
    share: float
    facts: tuple[SeedFact, ...] = ()  # hipporag2 / hybrid: the kept facts naming this phrase
    entities: tuple[str, ...] = ()  # hipporag1: the query entities linked to this phrase


@dataclass(frozen=True)
class Bridge:
    """A neighbour of the hit's passage on the graph through which a seed's mass arrived."""

    phrase: str
    node: int
    mass: float  # the part of the seed's term that entered the passage from this phrase


@dataclass(frozen=True)
class SeedContribution:
    """One seed's term in a hit's score, and the phrases its mass came through (largest first;
    ``other`` is the rest of the term: smaller bridges, and the iterate's residual)."""

    phrase: str
    node: int
    contribution: float
    bridges: tuple[Bridge, ...]
    other: float


@dataclass(frozen=True)
class DensePrior:
    """The dense passage prior's term: ``own`` from this passage's own prior weight, ``spread``
    from the prior of other passages that walked here (own + spread = total)."""

    total: float
    own: float
    spread: float
    prior: float  # the passage's entry of the reset vector (passage_node_weight · minmax(cos))
    similarity: float  # the query-passage cosine it came from


@dataclass(frozen=True)
class Fusion:
    """hybrid: the passage's ranks (0-based) in the fused rankings and its reciprocal-rank
    terms, which sum to the hit's score exactly (hippo_gpu.retrieval.hybrid.hybrid_fusion)."""

    ppr_rank: int
    dense_rank: int
    entity_rank: int | None  # None: no entity ranking (entity weight 0)
    ppr_term: float
    dense_term: float
    entity_term: float


@dataclass(frozen=True)
class HitExplanation:
    """One hit and its decomposition: ``value`` = Σ seeds' contributions + dense total + offset,
    within ``bound``.

    ``value`` is the hit's score (hipporag2, hipporag1, dense) or, for hybrid, the passage's
    PPR probability, the input of its PPR rank (``fusion`` then splits the score itself).
    """

    hit: Hit
    value: float
    seeds: tuple[SeedContribution, ...]  # largest contribution first
    dense: DensePrior | None  # None: hipporag1 (no dense prior)
    offset: float  # hipporag1: the min-max shift −lo/(hi − lo) (retrieval/explain.py); else 0
    bound: float  # |Σ terms − value| ≤ bound, certified
    fusion: Fusion | None = None

    @property
    def total(self) -> float:
        """Σ of the terms (what ``value`` is split into)."""
        dense = self.dense.total if self.dense is not None else 0.0
        return math.fsum([s.contribution for s in self.seeds] + [dense, self.offset])


@dataclass(frozen=True)
class PhraseInfo:
    """A phrase named by an explanation: the passages that mention it and its synonym edges."""

    phrase: str
    node: int
    passages: tuple[int, ...]  # passage rows (at most explain.PHRASE_PASSAGES of them)
    num_passages: int  # all of them
    synonyms: tuple[tuple[str, float], ...]  # (phrase, cosine), strongest first


@dataclass(frozen=True)
class QueryExplanation:
    """Why each hit of one query ranked where it did.

    ``dense_answer``: the query was answered by the dense ranking (mode dense, or hipporag2 with
    no kept fact), so its hits have a dense term only.
    """

    query: str
    mode: str
    hits: tuple[HitExplanation, ...]
    seeds: tuple[Seed, ...]  # largest weight first
    facts: tuple[SeedFact, ...]  # the kept facts (hipporag2 / hybrid), best first
    dense_share: float  # the dense prior's share of the PPR mass (1 − Σ seed shares)
    dense_answer: bool
    phrases: tuple[PhraseInfo, ...]  # every phrase named above
    # hipporag1 and hybrid: the entities linked (Ranking.entities); None in the other modes
    entities: tuple[str, ...] | None = None

    @property
    def bound(self) -> float:
        """The largest bound of a hit (0 without hits)."""
        return max((h.bound for h in self.hits), default=0.0)


def explanation_dict(e: QueryExplanation, passage_keys: Sequence[str],
                     passage_titles: Sequence[str],
                     passage_texts: Sequence[str] | None = None) -> dict[str, Any]:
    """``e`` as JSON-ready dicts: passages by key and title (a hit also by its text, when
    ``passage_texts`` is given), non-finite floats as None. The one JSON form of an
    explanation."""

    def passage(row: int) -> dict[str, Any]:
        return {"key": passage_keys[row], "title": passage_titles[row]}

    def fact(f: SeedFact) -> dict[str, Any]:
        return {"row": f.row, "fact": list(f.fact), "score": _num(f.score)}

    def hit(h: HitExplanation) -> dict[str, Any]:
        d = h.dense
        fu = h.fusion
        text = {} if passage_texts is None else {"text": passage_texts[h.hit.row]}
        return {
            **passage(h.hit.row), **text, "score": _num(h.hit.score), "rank": h.hit.rank,
            **label_fields(h.hit.id, h.hit.metadata),
            "value": _num(h.value), "total": _num(h.total), "bound": _num(h.bound),
            "offset": _num(h.offset),
            "seeds": [{"phrase": s.phrase, "node": s.node, "contribution": _num(s.contribution),
                       "other": _num(s.other),
                       "bridges": [{"phrase": b.phrase, "node": b.node, "mass": _num(b.mass)}
                                   for b in s.bridges]} for s in h.seeds],
            "dense": None if d is None else {
                "total": _num(d.total), "own": _num(d.own), "spread": _num(d.spread),
                "prior": _num(d.prior), "similarity": _num(d.similarity)},
            "fusion": None if fu is None else {
                "ppr_rank": fu.ppr_rank, "dense_rank": fu.dense_rank,
                "entity_rank": fu.entity_rank, "ppr_term": _num(fu.ppr_term),
                "dense_term": _num(fu.dense_term), "entity_term": _num(fu.entity_term)},
        }

    return {
        "query": e.query, "mode": e.mode, "dense_answer": e.dense_answer,
        "entities": None if e.entities is None else list(e.entities),
        "bound": _num(e.bound), "dense_share": _num(e.dense_share),
        "seeds": [{"phrase": s.phrase, "node": s.node, "weight": _num(s.weight),
                   "share": _num(s.share), "facts": [fact(f) for f in s.facts],
                   "entities": list(s.entities)} for s in e.seeds],
        "facts": [fact(f) for f in e.facts],
        "hits": [hit(h) for h in e.hits],
        "phrases": [{"phrase": p.phrase, "node": p.node, "num_passages": p.num_passages,
                     "passages": [passage(r) for r in p.passages],
                     "synonyms": [{"phrase": s, "score": _num(c)} for s, c in p.synonyms]}
                    for p in e.phrases],
    }


def _num(x: float) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None
