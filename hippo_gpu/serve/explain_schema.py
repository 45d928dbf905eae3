"""The body of POST /v1/explain (hippo_gpu.retrieval.explain's decomposition as pydantic models):
per query its seeds and kept facts, per hit its value split into one term per seed (with the bridge
phrases the term entered through), the dense prior's term and hybrid's fusion, and the phrases
named, with their passages and synonyms. The request is schema.py's (ExplainRequest: retrieve's
limits). The model class names are the OpenAPI component names.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

__all__ = ["ExplainResponse", "QueryExplanationBody", "SeedFact"]

SeedFact = tuple[str, str, str]  # (subject, predicate, object)


class ExplainedPassage(BaseModel):
    key: str
    title: str


class ExplainFact(BaseModel):
    row: int = Field(description="fact row in the index")
    fact: SeedFact
    score: float = Field(description="min-max scaled query-fact cosine over all facts")


class ExplainSeed(BaseModel):
    phrase: str
    node: int = Field(description="node row of the phrase")
    weight: float = Field(description="its entry of the reset vector, before normalisation")
    share: float = Field(description="the fraction of the query's PPR mass that starts here")
    facts: list[ExplainFact] = Field(description="the kept facts naming it (hipporag2, hybrid)")
    entities: list[str] = Field(description="the query entities linked to it (hipporag1)")


class ExplainBridge(BaseModel):
    phrase: str
    node: int
    mass: float = Field(description="the part of the seed's term entering through this phrase")


class ExplainSeedTerm(BaseModel):
    phrase: str
    node: int
    contribution: float = Field(description="this seed's term of the hit's value")
    other: float = Field(description="the term's mass not through the listed bridges")
    bridges: list[ExplainBridge] = Field(description="neighbours of the passage, largest first")


class ExplainDense(BaseModel):
    total: float = Field(description="the dense passage prior's term (own + spread)")
    own: float = Field(description="from the passage's own prior weight")
    spread: float = Field(description="from the prior of the other passages")
    prior: float = Field(description="the passage's entry of the reset vector")
    similarity: float = Field(description="its query-passage cosine")


class ExplainFusion(BaseModel):
    ppr_rank: int = Field(ge=0)
    dense_rank: int = Field(ge=0)
    entity_rank: int | None = Field(description="null: no entity ranking")
    ppr_term: float
    dense_term: float
    entity_term: float


class ExplainedHit(BaseModel):
    key: str
    title: str
    text: str
    score: float
    rank: int = Field(ge=0)
    id: str | None = Field(default=None, description="the passage's own id; absent: none")
    metadata: dict[str, Any] | None = Field(
        default=None, description="the passage's own metadata; absent: none")
    value: float = Field(description="what the terms sum to: the score, or hybrid's PPR value")
    total: float = Field(description="the sum of the terms")
    bound: float | None = Field(description="|total - value| <= bound, certified (null: none)")
    offset: float = Field(description="hipporag1's min-max shift; else 0")
    seeds: list[ExplainSeedTerm] = Field(description="one term per seed, largest first")
    dense: ExplainDense | None = Field(description="null for hipporag1")
    fusion: ExplainFusion | None = Field(description="hybrid: the fused ranks and terms")


class ExplainSynonym(BaseModel):
    phrase: str
    score: float = Field(description="cosine of the synonym edge")


class ExplainPhrase(BaseModel):
    phrase: str
    node: int
    num_passages: int = Field(ge=0)
    passages: list[ExplainedPassage] = Field(description="the passages mentioning it (capped)")
    synonyms: list[ExplainSynonym]


class QueryExplanationBody(BaseModel):
    query: str
    mode: str
    dense_answer: bool = Field(description="answered by the dense ranking: one dense term")
    entities: list[str] | None = Field(default=None, description=(
        "hipporag1 and hybrid: the entities linked (the request's, or the capitalised spans of "
        "the query); empty: none, so hipporag1 scored every passage alike; null in other modes"))
    bound: float | None = Field(description="the largest bound of a hit")
    dense_share: float = Field(description="the dense prior's share of the PPR mass")
    seeds: list[ExplainSeed]
    facts: list[ExplainFact] = Field(description="the kept facts, best first")
    hits: list[ExplainedHit]
    phrases: list[ExplainPhrase] = Field(description="every phrase named above")


class ExplainResponse(BaseModel):
    explanations: list[QueryExplanationBody | None] = Field(
        description="per query, in request order: its hits and their decomposition (null: the "
        "query failed, see errors)")
    errors: list[str | None] | None = Field(
        default=None,
        description="present only when some query failed: per query, null or why (a request "
        "of one query that fails gets a 500 instead)",
    )
