"""Recognition-memory filter (HippoRAG 2): an LLM keeps the candidate facts relevant to a query.

For a batch of Q queries, each with its top `linking_top_k` candidate facts, one concurrent wave
of LLM calls (one per uncached query) returns the facts to keep. Each fact the LLM writes is
mapped back to a candidate (exact match, else the closest by difflib ratio, as upstream), in the
LLM's order, without repeats.

Failure semantics follow upstream: a query whose call or parse fails keeps no facts, and the
retrieval layer then falls back to dense passage ranking. Unlike upstream, the fallback is
counted (`FilterOutcome.fallbacks`, with reasons), never silent.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hippo_gpu.llm.backends import Backend, ChatRequest, Completion, canonical_json
from hippo_gpu.llm.cache import LLMCache, cache_key
from hippo_gpu.llm.llm_step import LLMStep
from hippo_gpu.llm.parse import Limits, OutputRejected, ParseStats, match_facts, parse_triples
from hippo_gpu.llm.prompts import RECOGNITION_FILTER, triple_schema

Fact = tuple[str, str, str]


@dataclass
class FilterOutcome:
    """Result of filtering a batch of Q queries.

    Attributes:
        kept: per query, indices into its candidate list, in LLM order (len <= candidates).
        fallbacks: queries whose LLM call or parse failed (they keep nothing).
        reasons: failure reason -> count.
        failed: indices of the queries that fell back.
        cached: queries answered from the cache.
        empty: queries for which the LLM validly kept no fact.
        parse: parse statistics of this wave.
    """

    kept: list[list[int]]
    fallbacks: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    failed: list[int] = field(default_factory=list)
    cached: int = 0
    empty: int = 0
    parse: ParseStats = field(default_factory=ParseStats)


class RecognitionMemoryFilter(LLMStep):
    """Callable `(queries, candidates) -> FilterOutcome`.

    Args:
        backend: a `Backend` or a spec string (then this object owns and closes it).
        cache: an `LLMCache`, a cache path, or None.
        max_tokens: generation cap per query (upstream: 512).
        temperature: sampling temperature.
        use_schema: constrain output to `{"fact": [[s, p, o], ...]}` with at most as many facts
            as there are candidates.
        cutoff: minimum difflib ratio to map a written fact to a candidate (upstream: 0.0).
    """

    def __init__(
        self,
        backend: Backend | str,
        cache: LLMCache | str | Path | None = None,
        *,
        max_tokens: int = 512,
        temperature: float = 0.0,
        use_schema: bool = True,
        cutoff: float = 0.0,
    ) -> None:
        super().__init__(backend, cache)
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.use_schema = use_schema
        self.cutoff = cutoff

    def _request(self, query: str, facts: Sequence[Fact]) -> ChatRequest:
        longest = max(len(part) for fact in facts for part in fact)
        schema = triple_schema(len(facts), max(longest + 16, 64), key="fact")
        return ChatRequest(
            RECOGNITION_FILTER.render(
                question=query, facts=json.dumps({"fact": [list(f) for f in facts]})
            ),
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            json_schema=schema if self.use_schema else None,
            schema_name="fact",
        )

    def _key(self, query: str, facts: Sequence[Fact]) -> str:
        params = {"max_tokens": self.max_tokens, "temperature": self.temperature,
                  "schema": self.use_schema, "cutoff": self.cutoff}
        content = canonical_json([query, [list(f) for f in facts]])
        return cache_key("filter", RECOGNITION_FILTER.key, self.backend.model, params, content)

    def __call__(
        self, queries: Sequence[str], candidates: Sequence[Sequence[Fact]]
    ) -> FilterOutcome:
        """Filter Q queries' candidate facts in one wave of LLM calls."""
        if len(queries) != len(candidates):
            raise ValueError(f"{len(queries)} queries but {len(candidates)} candidate lists")
        outcome = FilterOutcome(kept=[[] for _ in queries])
        todo: list[int] = []
        keys: dict[int, str] = {}
        for q, (query, facts) in enumerate(zip(queries, candidates)):
            if not facts:
                continue  # nothing to filter: the retrieval layer goes dense, as upstream
            keys[q] = self._key(query, facts)
            hit = self.cache.get_ok(keys[q]) if self.cache is not None else None
            if hit is not None:
                outcome.kept[q] = [int(i) for i in hit]
                outcome.cached += 1
            else:
                todo.append(q)

        def on_result(j: int, c: Completion) -> None:
            q = todo[j]
            facts = candidates[q]
            reason = None
            if not c.ok:
                reason = str(c.error)
            else:
                try:
                    limits = Limits(max_items=max(len(facts), 1) * 4)
                    written = parse_triples(c.text, limits=limits, stats=outcome.parse,
                                            names=("fact", "facts"))
                except OutputRejected as e:
                    reason = e.reason
            if reason is not None:
                outcome.fallbacks += 1
                outcome.reasons[reason] += 1
                outcome.failed.append(q)
                return
            kept = match_facts(written, facts, cutoff=self.cutoff)
            outcome.kept[q] = kept
            if self.cache is not None:
                self.cache.put_ok(keys[q], "filter", kept, prompt_tokens=c.prompt_tokens,
                                  completion_tokens=c.completion_tokens)

        self.backend.generate(
            [self._request(queries[q], candidates[q]) for q in todo], on_result
        )
        outcome.failed.sort()
        outcome.empty = sum(1 for q, k in enumerate(outcome.kept)
                            if not k and candidates[q] and q not in set(outcome.failed))
        return outcome

