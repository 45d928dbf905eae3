"""IRCoT (hippo_gpu.retrieval.ircot, hippo_gpu.llm.ircot) against a scripted OpenAI-compatible
server on loopback: upstream's loop (written out below as `upstream_loop`, one question at a time
over
`Searcher.retrieve`), the stop rule, the max-merge, the prompt's passages, batching invariance,
one batched retrieval per step, failures that end one question only, and the cache."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("openai")

from hippo_gpu.llm.ircot import IRCoTReasoner, parse_thought  # noqa: E402
from hippo_gpu.retrieval.ircot import (  # noqa: E402
    STOP_PHRASE,
    IRCoTOptions,
    Thought,
    ThoughtRequest,
    ircot_one_at_a_time,
    ircot_retrieve,
)
from tests.retrieval.ircot_thoughts import QUESTIONS, SCRIPT  # noqa: E402
from tests.scripted_llm import HTTP, fast_backend, scripted_llm  # noqa: E402

Q1, Q2, Q3, Q4 = QUESTIONS


class CountingSearcher:
    """The real searcher, with every `rank` call's queries and the entities it linked (the
    ranking's: the caller's or the LLM-free extractor's) recorded."""

    def __init__(self, searcher: Any) -> None:
        self._s = searcher
        self.index = searcher.index
        self.calls: list[list[str]] = []
        self.entities: list[Any] = []

    def rank(self, queries: list[str], **kw: Any) -> Any:
        self.calls.append(list(queries))
        ranking = self._s.rank(queries, **kw)
        self.entities.append(ranking.entities)
        return ranking

    def to_hits(self, ranking: Any) -> Any:
        return self._s.to_hits(ranking)


def upstream_loop(searcher: Any, question: str, thoughts_of: list[str], *, max_steps: int,
                  top_k: int, mode: str) -> tuple[list[tuple[str, float]], list[str],
                                                  list[list[str]]]:
    """retrieve_ircot of upstream main@c617143 for one question, its LLM replaced by the
    script: (merged (key, score) by score, thoughts, the keys shown at each step)."""
    hits = searcher.retrieve([question], top_k=top_k, mode=mode)[0]
    merged = {h.key: h.score for h in hits}
    thoughts: list[str] = []
    shown = []
    for _ in range(1, max_steps):
        ranked = sorted(merged, key=merged.get, reverse=True)
        shown.append(ranked[:top_k])
        thought = thoughts_of[len(thoughts)]
        thoughts.append(thought)
        if "So the answer is:" in thought:
            break
        for h in searcher.retrieve([thought], top_k=top_k, mode=mode)[0]:
            merged[h.key] = max(merged.get(h.key, float("-inf")), h.score)
    return sorted(merged.items(), key=lambda kv: kv[1], reverse=True), thoughts, shown


@pytest.fixture(scope="module")
def llm():
    with scripted_llm(SCRIPT) as (server, spec):
        yield server, spec


def _same(got: Any, want: list[tuple[str, float]]) -> None:
    assert [h.key for h in got.hits] == [k for k, _ in want]
    # float32 scores: the query encoder rounds with the batch's shape (~1e-8), see
    # tests/serve/helpers.py; the order must be the same
    assert [h.score for h in got.hits] == pytest.approx([s for _, s in want], rel=1e-5, abs=1e-7)
    assert [h.rank for h in got.hits] == list(range(len(want)))


@pytest.mark.parametrize("mode", ["hipporag2", "dense", "hybrid"])
def test_batched_loop_is_upstreams_loop(sample_searcher, llm, mode: str) -> None:
    server, spec = llm
    reasoner = IRCoTReasoner(fast_backend(spec))
    spy = CountingSearcher(sample_searcher)
    start = len(server.prompts)
    report = ircot_retrieve(spy, QUESTIONS, reasoner, max_steps=4, top_k=3, mode=mode)
    text_of = dict(zip(sample_searcher.index.passage_keys, sample_searcher.index.passage_texts))
    for q, res in zip(QUESTIONS, report.results):
        want, thoughts, shown = upstream_loop(sample_searcher, q, SCRIPT[q], max_steps=4,
                                              top_k=3, mode=mode)
        _same(res, want)
        assert res.thoughts == thoughts == SCRIPT[q][:len(thoughts)]
        assert res.stop == ("answer" if STOP_PHRASE in thoughts[-1] else "max_steps")
        assert res.steps == 1 + len(thoughts) and res.error is None
        # each step's prompt showed ranked[:k] of the merged list so far, best first
        prompts = [p for p in server.prompts[start:] if f"Question: {q}\n" in p[-1]["content"]]
        assert len(prompts) == len(shown)
        for keys, prompt in zip(shown, prompts):
            user = prompt[-1]["content"]
            blocks = [f"Wikipedia Title: {text_of[k]}\n\n" for k in keys]
            assert user.startswith("".join(blocks))
    # one batched retrieval per step: all 4 questions, then the active thoughts (Q3 stops at
    # its 2nd thought, Q1 and Q4 at their 3rd)
    assert spy.calls == [QUESTIONS, [SCRIPT[q][0] for q in QUESTIONS],
                         [SCRIPT[q][1] for q in (Q1, Q2, Q4)], [SCRIPT[Q2][2]]]
    assert report.retrieval_calls == 4 and report.active == [4, 4, 3]
    assert report.thought_requests == 11


def test_batched_equals_one_at_a_time(sample_searcher, llm) -> None:
    _, spec = llm
    reasoner = IRCoTReasoner(fast_backend(spec))
    batched = ircot_retrieve(sample_searcher, QUESTIONS, reasoner, max_steps=3, top_k=5)
    alone = ircot_one_at_a_time(sample_searcher, QUESTIONS, reasoner, max_steps=3, top_k=5)
    for b, a in zip(batched.results, alone.results, strict=True):
        _same(b, [(h.key, h.score) for h in a.hits])
        assert (b.thoughts, b.stop, b.steps) == (a.thoughts, a.stop, a.steps)
        assert [h.row for h in b.hits] == [h.row for h in a.hits]
    assert alone.retrieval_calls == 4 + 4 + 3  # one call per question and step
    assert batched.retrieval_calls == 3


def test_hipporag1_thoughts_get_capitalised_span_entities(sample_searcher, llm) -> None:
    from hippo_gpu.retrieval.entities import heuristic_entities

    _, spec = llm
    ents = [["Marta Quill"], ["Lumen Museum"], ["Varnholt"], ["Lumen Museum", "Skerrow"]]
    spy = CountingSearcher(sample_searcher)
    batched = ircot_retrieve(spy, QUESTIONS, IRCoTReasoner(fast_backend(spec)), max_steps=2,
                             top_k=3, mode="hipporag1", query_entities=ents)
    assert spy.entities == [ents, heuristic_entities([SCRIPT[q][0] for q in QUESTIONS])]
    alone = ircot_one_at_a_time(sample_searcher, QUESTIONS, IRCoTReasoner(fast_backend(spec)),
                                max_steps=2, top_k=3, mode="hipporag1", query_entities=ents)
    for b, a in zip(batched.results, alone.results, strict=True):
        _same(b, [(h.key, h.score) for h in a.hits])
        assert b.thoughts == a.thoughts == SCRIPT[b.question][:1]


def test_max_steps_one_is_one_retrieval_without_llm(sample_searcher, llm) -> None:
    server, spec = llm
    before = len(server.requests)
    report = ircot_retrieve(sample_searcher, QUESTIONS, IRCoTReasoner(fast_backend(spec)),
                            max_steps=1, top_k=4)
    assert len(server.requests) == before
    for q, res in zip(QUESTIONS, report.results):
        _same(res, [(h.key, h.score) for h in sample_searcher.retrieve([q], top_k=4)[0]])
        assert (res.thoughts, res.stop, res.steps) == ([], "max_steps", 1)
    with pytest.raises(ValueError, match="max_steps"):
        ircot_retrieve(sample_searcher, QUESTIONS, IRCoTReasoner(fast_backend(spec)),
                       max_steps=0)


def test_a_failing_thought_ends_only_its_question(sample_searcher) -> None:
    script = {**SCRIPT, Q2: [SCRIPT[Q2][0], HTTP(500)], Q3: [""]}
    with scripted_llm(script) as (_, spec):
        reasoner = IRCoTReasoner(fast_backend(spec))
        report = ircot_retrieve(sample_searcher, QUESTIONS, reasoner, max_steps=4, top_k=3)
    by_q = dict(zip(QUESTIONS, report.results))
    assert (by_q[Q2].stop, by_q[Q2].error, by_q[Q2].thoughts) == \
        ("thought_failed", "http_500", SCRIPT[Q2][:1])
    assert (by_q[Q3].stop, by_q[Q3].error, by_q[Q3].thoughts) == \
        ("thought_failed", "empty_thought", [])
    # what each had is kept: Q3 its own retrieval, Q2 that and its first thought's
    _same(by_q[Q3], [(h.key, h.score) for h in sample_searcher.retrieve([Q3], top_k=3)[0]])
    want, _, _ = upstream_loop(sample_searcher, Q2, SCRIPT[Q2], max_steps=2, top_k=3,
                               mode="hipporag2")
    _same(by_q[Q2], want)
    for q in (Q1, Q4):  # the others are untouched
        want, thoughts, _ = upstream_loop(sample_searcher, q, SCRIPT[q], max_steps=4, top_k=3,
                                          mode="hipporag2")
        _same(by_q[q], want)
        assert by_q[q].stop == "answer" and by_q[q].thoughts == thoughts
    assert reasoner.failures == {"http_500": 1, "empty_thought": 1}


def test_thoughts_come_back_from_the_cache(sample_searcher, tmp_path) -> None:
    from hippo_gpu.llm.cache import LLMCache

    with scripted_llm(SCRIPT) as (server, spec):
        with LLMCache(tmp_path / "c.sqlite") as cache:
            first = IRCoTReasoner(fast_backend(spec), cache)
            a = ircot_retrieve(sample_searcher, QUESTIONS, first, max_steps=3, top_k=3)
            n = len(server.requests)
            again = IRCoTReasoner(fast_backend(spec), cache)
            b = ircot_retrieve(sample_searcher, QUESTIONS, again, max_steps=3, top_k=3)
        assert len(server.requests) == n == first.calls == 4 + 4
        assert again.calls == 0 and again.cached == 8
    assert [r.thoughts for r in a.results] == [r.thoughts for r in b.results]
    # another prompt is another cache key
    assert IRCoTReasoner(fast_backend(spec), dataset="musique").identity["prompt"] != \
        first.identity["prompt"]


def test_a_source_that_miscounts_is_an_error(sample_searcher) -> None:
    class Short:
        identity: dict[str, Any] = {}

        def __call__(self, requests: list[ThoughtRequest]) -> list[Thought]:
            return [Thought("x")] * (len(requests) - 1)

    with pytest.raises(ValueError, match="3 thoughts for 4 requests"):
        ircot_retrieve(sample_searcher, QUESTIONS, Short(), max_steps=2, top_k=2)
    with pytest.raises(ValueError, match="max_steps"):
        IRCoTOptions(Short(), 0)


def test_parse_thought() -> None:
    assert parse_thought("  Thought:  Marta Quill\n was born  there. ") == \
        Thought("Marta Quill was born there.")
    assert parse_thought("thought: THOUGHT: x") == Thought("x")
    assert parse_thought(" \n ") == Thought(None, "empty_thought")
    assert parse_thought(None) == Thought(None, "empty_thought")
    assert parse_thought("y" * 11, max_chars=10) == Thought(None, "thought_too_long")
