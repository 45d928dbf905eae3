"""IRCoT: retrieval interleaved with one chain-of-thought step at a time, for a batch of questions.

Semantics (upstream HippoRAG 2 main@c617143, `HippoRAG.retrieve_ircot`), for each question q with
`max_steps` S >= 1 and `top_k` k:

    1. R = retrieve(q, top k);  merged[p] = score_R(p) for each passage p of R
    2. for step 1 .. S-1:
           ranked  = the passages of `merged` by score, descending (ties: the passage merged
                     first comes first, as Python's stable sort gives upstream)
           thought = reason(q, ranked[:k], thoughts so far);  append it to the thoughts
           if STOP_PHRASE in thought: stop
           R = retrieve(thought, top k);  merged[p] = max(merged[p] (or -inf), score_R(p))
    3. the result: every passage of `merged` by score, descending, and the thoughts

Passages are merged by key (upstream merges by passage text; a key is the md5 of that text).
A question's `steps` counts its retrievals' reasoning steps: 1 + its thoughts, at most S.

Batching. Upstream runs that loop one question at a time. Here every question advances in lock
step: at step s the still-active questions' thoughts come from ONE call of the thought source
(the LLM layer sends them concurrently, through its cache and retries: hippo_gpu.llm.ircot), and
the thoughts that go on are answered by ONE batched retrieval. Nothing of one question reaches
another: its merge reads only its own rankings, and a `Searcher` ranks each query of a batch as
it ranks it alone (tests/retrieval/test_determinism.py), so the batched loop gives every question
what the one-at-a-time loop (`ircot_one_at_a_time`) gives it with the same thoughts
(tests/retrieval/test_ircot.py).

Robustness. A thought that failed (the LLM call failed after its retries, or the reply was
unusable) ends that question's loop with the passages it has: `stop` "thought_failed" and
`error` the reason. A thought whose retrieval failed (an uncertified PPR,
hippo_gpu.retrieval.results) ends it the same way ("retrieval_failed"); a question whose own
retrieval failed has no passages. The other questions of the batch go on either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from hippo_gpu.config import RetrievalConfig
from hippo_gpu.retrieval.modes import Mode, mode_of
from hippo_gpu.retrieval.results import FactFilter, Hit
from hippo_gpu.retrieval.searcher import Searcher

__all__ = ["STOPS", "STOP_PHRASE", "IRCoTOptions", "IRCoTReport", "IRCoTResult", "Retrieved",
           "Thought", "ThoughtRequest", "ThoughtSource", "ircot_one_at_a_time", "ircot_retrieve",
           "run_ircot"]

STOP_PHRASE = "So the answer is:"
# why a question's loop ended: its thought gave the answer, it used all its steps, its thought
# failed, or a retrieval of it failed
STOPS = ("answer", "max_steps", "thought_failed", "retrieval_failed")


@dataclass(frozen=True)
class ThoughtRequest:
    """What one reasoning step sees: the question, its best passages so far and its thoughts."""

    question: str
    passages: tuple[str, ...]  # the texts of ranked[:k], best first (title, newline, body)
    thoughts: tuple[str, ...]  # the thoughts so far, oldest first


@dataclass(frozen=True)
class Thought:
    """One reasoning step's answer: `text`, or None and why (`error`)."""

    text: str | None
    error: str | None = None


class ThoughtSource(Protocol):
    """Writes the next thought of each request; one call per step for all active questions.

    `identity` names what decides the thoughts (model, prompt, generation settings): the batch
    job keeps it in its run identity, so a resumed run uses the same source.
    """

    @property
    def identity(self) -> Mapping[str, Any]: ...

    def __call__(self, requests: Sequence[ThoughtRequest]) -> Sequence[Thought]: ...


@dataclass(frozen=True)
class Retrieved:
    """One query's ranking from one retrieval: its hits, best first, or why it has none."""

    hits: list[Hit]
    error: str | None = None


# (query texts, step) -> one Retrieved per text, in order; step 0 retrieves the questions
Retrieve = Callable[[list[str], int], list[Retrieved]]


@dataclass
class IRCoTResult:
    """One question's IRCoT outcome.

    Attributes:
        question: the question.
        hits: every merged passage, by merged score descending (`rank` its position, `score`
            its merged score, `row` from the retrieval that found it first).
        thoughts: the thoughts written, in order.
        stop: why the loop ended, one of STOPS.
        error: the failure behind "thought_failed" / "retrieval_failed", else None.
    """

    question: str
    hits: list[Hit]
    thoughts: list[str]
    stop: str
    error: str | None = None

    @property
    def steps(self) -> int:
        """Reasoning steps taken: the question's own retrieval and one per thought."""
        return 1 + len(self.thoughts)

    @property
    def failed(self) -> bool:
        """The question's own retrieval failed: it has no passages (and no thoughts)."""
        return self.stop == "retrieval_failed" and not self.thoughts


@dataclass(frozen=True)
class IRCoTOptions:
    """What turns a retrieval job into an IRCoT one: the thought source and the step count."""

    reason: ThoughtSource
    max_steps: int = 3

    def __post_init__(self) -> None:
        if isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int) or \
                self.max_steps < 1:
            raise ValueError(f"max_steps must be an integer >= 1, got {self.max_steps!r}")

    def identity(self) -> dict[str, Any]:
        """The step count and the source's identity (a batch job's run identity holds it)."""
        return {"max_steps": self.max_steps, **dict(self.reason.identity)}


@dataclass
class IRCoTReport:
    """The results of a batch, in question order, and what producing them cost.

    Attributes:
        results: one IRCoTResult per question.
        thought_requests: thoughts asked of the source (cache hits included).
        retrieval_calls: calls of the batched retrieval (at most S per batch).
        retrieved_queries: queries they ranked in all (questions and thoughts).
        active: per step, the questions that asked for a thought.
        stage_seconds: "retrieve" and "reason" wall time, and each retrieval stage's
            ("retrieve/encode", ...) where the retrieval reports them.
    """

    results: list[IRCoTResult]
    thought_requests: int = 0
    retrieval_calls: int = 0
    retrieved_queries: int = 0
    active: list[int] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)

    def extend(self, other: IRCoTReport) -> None:
        """Append another batch's report (its questions after these)."""
        self.results.extend(other.results)
        self.thought_requests += other.thought_requests
        self.retrieval_calls += other.retrieval_calls
        self.retrieved_queries += other.retrieved_queries
        for s, n in enumerate(other.active):
            if s < len(self.active):
                self.active[s] += n
            else:
                self.active.append(n)
        for k, v in other.stage_seconds.items():
            self.stage_seconds[k] = self.stage_seconds.get(k, 0.0) + v


class _Merged:
    """One question's merged passages: key -> best score, and the first hit seen of each."""

    def __init__(self) -> None:
        self.score: dict[str, float] = {}
        self.first: dict[str, Hit] = {}

    def add(self, hits: Sequence[Hit]) -> None:
        for h in hits:
            old = self.score.get(h.key)
            self.score[h.key] = h.score if old is None else max(old, h.score)
            self.first.setdefault(h.key, h)

    def ranked(self) -> list[str]:
        """Keys by score, descending; ties keep merge order (sorted is stable)."""
        return sorted(self.score, key=self.score.__getitem__, reverse=True)

    def hits(self) -> list[Hit]:
        return [replace(self.first[k], score=self.score[k], rank=i)
                for i, k in enumerate(self.ranked())]


def run_ircot(questions: Sequence[str], retrieve: Retrieve, reason: ThoughtSource,
              passage_text: Callable[[Hit], str], *, max_steps: int, top_k: int
              ) -> IRCoTReport:
    """The batched loop over any retrieval (the Searcher's, the server's micro-batcher).

    Args:
        questions: Q questions.
        retrieve: one batched retrieval per call (see `Retrieve`), top `top_k` per query.
        reason: the thought source; one call per step with every active question.
        passage_text: the text of a hit, as the thought prompt shows it.
        max_steps: S >= 1 (1: the questions' own retrieval only, no thought).
        top_k: k, the passages per retrieval and in each thought's prompt.
    """
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be an integer >= 1, got {max_steps!r}")
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    questions = list(questions)
    n = len(questions)
    merged = [_Merged() for _ in range(n)]
    thoughts: list[list[str]] = [[] for _ in range(n)]
    stop: list[str | None] = [None] * n
    error: list[str | None] = [None] * n
    report = IRCoTReport([])
    seconds = {"retrieve": 0.0, "reason": 0.0}

    def ranked_retrieval(texts: list[str], step: int, rows: list[int]) -> None:
        start = time.perf_counter()
        found = retrieve(texts, step)
        seconds["retrieve"] += time.perf_counter() - start
        if len(found) != len(texts):
            raise ValueError(f"retrieval returned {len(found)} rankings for {len(texts)} queries")
        report.retrieval_calls += 1
        report.retrieved_queries += len(texts)
        for i, r in zip(rows, found):
            if r.error is not None:
                stop[i], error[i] = "retrieval_failed", r.error
            else:
                merged[i].add(r.hits)

    if n:
        ranked_retrieval(questions, 0, list(range(n)))
    for step in range(1, max_steps):
        active = [i for i in range(n) if stop[i] is None]
        if not active:
            break
        report.active.append(len(active))
        requests = [ThoughtRequest(questions[i],
                                   tuple(passage_text(merged[i].first[k])
                                         for k in merged[i].ranked()[:top_k]),
                                   tuple(thoughts[i]))
                    for i in active]
        start = time.perf_counter()
        got = list(reason(requests))
        seconds["reason"] += time.perf_counter() - start
        report.thought_requests += len(requests)
        if len(got) != len(requests):
            raise ValueError(f"the thought source returned {len(got)} thoughts for "
                             f"{len(requests)} requests")
        go = []
        for i, t in zip(active, got):
            if t.text is None:
                stop[i], error[i] = "thought_failed", t.error or "no thought"
                continue
            thoughts[i].append(t.text)
            if STOP_PHRASE in t.text:
                stop[i] = "answer"
            else:
                go.append(i)
        if go:
            ranked_retrieval([thoughts[i][-1] for i in go], step, go)
    report.results = [IRCoTResult(q, merged[i].hits(), thoughts[i], stop[i] or "max_steps",
                                  error[i])
                      for i, q in enumerate(questions)]
    report.stage_seconds.update(seconds)
    return report


def ircot_retrieve(
    searcher: Searcher,
    questions: Sequence[str],
    reason: ThoughtSource,
    *,
    max_steps: int = 3,
    top_k: int = 10,
    mode: str | Mode = "hipporag2",
    config: RetrievalConfig | None = None,
    fact_filter: FactFilter | None = None,
    query_entities: Sequence[Sequence[str]] | None = None,
    thought_entities: Callable[[list[str]], list[list[str]]] | None = None,
    where: Mapping[str, Any] | None = None,
) -> IRCoTReport:
    """IRCoT over a Searcher: one `Searcher.rank` call per step for all active questions.

    Args:
        searcher, mode, config, fact_filter: as for `Searcher.rank` (every step).
        questions, reason, max_steps, top_k: as for `run_ircot`.
        query_entities: the questions' entities for hipporag1 and hybrid (default: the
            Searcher's, the LLM-free extractor's capitalised spans).
        thought_entities: entities of thoughts for hipporag1 and hybrid (default: the same
            spans, the Searcher's default).
        where: a metadata filter applied to every step's ranking (`Searcher.retrieve`).
    """
    how = mode_of(mode)
    index = searcher.index

    def retrieve(texts: list[str], step: int) -> list[Retrieved]:
        if step == 0:
            entities = query_entities
        else:
            entities = thought_entities(texts) if thought_entities is not None and \
                how.reads_entities else None
        ranking = searcher.rank(texts, top_k=top_k, mode=how, config=config,
                                fact_filter=fact_filter, query_entities=entities, where=where)
        for k, v in ranking.stage_seconds.items():
            stages[f"retrieve/{k}"] = stages.get(f"retrieve/{k}", 0.0) + v
        return [Retrieved([], ranking.failed[j]) if j in ranking.failed else Retrieved(hits)
                for j, hits in enumerate(searcher.to_hits(ranking))]

    stages: dict[str, float] = {}
    report = run_ircot(questions, retrieve, reason, lambda h: index.passage_texts[h.row],
                       max_steps=max_steps, top_k=top_k)
    report.stage_seconds.update(stages)
    return report


def ircot_one_at_a_time(
    searcher: Searcher,
    questions: Sequence[str],
    reason: ThoughtSource,
    *,
    query_entities: Sequence[Sequence[str]] | None = None,
    **options: Any,
) -> IRCoTReport:
    """The upstream order: each question's whole loop alone, one question after another (the
    reference of the batched loop in tests and benchmarks). Options as for `ircot_retrieve`."""
    report = IRCoTReport([])
    for i, q in enumerate(questions):
        ents = None if query_entities is None else [query_entities[i]]
        report.extend(ircot_retrieve(searcher, [q], reason, query_entities=ents, **options))
    return report
