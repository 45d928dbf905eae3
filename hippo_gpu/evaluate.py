"""Evaluation: Recall@k per mode, queries/s and stage times (one-step or IRCoT); EM/F1 of answers.

Recall@k of a query = |top-k passages ∩ gold passages| / |gold passages|, averaged over queries
(HippoRAG's retrieval_eval). Passages are matched by chunk key (md5 of title + "\\n" + text).
IRCoT (`evaluate_ircot`) scores the merged list of each question (hippo_gpu.retrieval.ircot).
Answers (`hippo-gpu qa`, hippo_gpu.llm.qa) are scored by SQuAD's exact match and token F1
(`qa_metrics`).
"""

from __future__ import annotations

import re
import string
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hippo_gpu.config import RetrievalConfig
from hippo_gpu.data import Question
from hippo_gpu.retrieval.ircot import STOPS, IRCoTReport, ThoughtSource, ircot_retrieve
from hippo_gpu.retrieval.modes import Mode, mode_of
from hippo_gpu.retrieval.results import FactFilter, Ranking
from hippo_gpu.retrieval.searcher import Searcher

RECALL_KS = (1, 2, 5, 10, 20, 50, 100, 200)


def recall_at_k(ranked_keys: Sequence[Sequence[str]], gold: Sequence[set[str]],
                ks: Sequence[int] = RECALL_KS) -> dict[str, float]:
    """Mean recall@k in percent for each k; queries without gold passages are skipped."""
    pairs = [(r, g) for r, g in zip(ranked_keys, gold) if g]
    out = {}
    for k in ks:
        total = sum(len(set(r[:k]) & g) / len(g) for r, g in pairs)
        out[str(k)] = round(100.0 * total / max(len(pairs), 1), 2)
    return out


@dataclass
class ModeResult:
    mode: str
    recall: dict[str, float]
    queries_per_s: float
    stage_s: dict[str, float]
    seconds: float
    dense_fallbacks: int
    ranked_keys: list[list[str]]
    ppr_max_bound: float = 0.0  # the worst certified L1 bound of any query's PPR (0: none ran)
    ppr_refined: int = 0  # queries with a stalled float32 solve finished in float64
    failed: int = 0  # queries without an answer (uncertified PPR); they score recall 0

    def as_dict(self) -> dict[str, Any]:
        return {"recall": self.recall, "queries_per_s": round(self.queries_per_s, 3),
                "stage_s": {k: round(v, 4) for k, v in self.stage_s.items()},
                "seconds": round(self.seconds, 4), "dense_fallbacks": self.dense_fallbacks,
                "ppr_max_bound": self.ppr_max_bound, "ppr_refined": self.ppr_refined,
                "failed": self.failed}


def evaluate_mode(
    searcher: Searcher,
    questions: Sequence[Question],
    mode: str | Mode,
    *,
    top_k: int = 200,
    config: RetrievalConfig | None = None,
    fact_filter: FactFilter | None = None,
    query_entities: Sequence[Sequence[str]] | None = None,
    batch_size: int | None = None,
) -> ModeResult:
    """Run one mode over all questions (in batches of `batch_size`, default all at once)."""
    how = mode_of(mode)
    texts = [q.question for q in questions]
    gold = [{p.key for p in q.gold} for q in questions]
    _ = searcher.encoder  # load the query encoder outside the timed region
    bs = batch_size or max(len(texts), 1)
    rankings: list[Ranking] = []
    start = time.perf_counter()
    for i in range(0, len(texts), bs):
        ents = None if query_entities is None else query_entities[i:i + bs]
        rankings.append(searcher.rank(texts[i:i + bs], top_k=top_k, mode=how, config=config,
                                      fact_filter=fact_filter, query_entities=ents))
    seconds = time.perf_counter() - start
    stage: dict[str, float] = {}
    keys = searcher.index.passage_keys
    ranked: list[list[str]] = []
    fallbacks = refined = failed = 0
    worst = 0.0
    for r in rankings:
        for k, v in r.stage_seconds.items():
            stage[k] = stage.get(k, 0.0) + v
        ranked.extend([] if qi in r.failed else [keys[j] for j in row]
                      for qi, row in enumerate(r.passage_rows.cpu().tolist()))
        fallbacks += int(r.dense_fallback.sum()) if how.runs_ppr else 0
        if r.ppr_bound is not None and r.ppr_refined is not None:
            worst = max(worst, float(r.ppr_bound.max()) if r.ppr_bound.numel() else 0.0)
            refined += int(r.ppr_refined.sum())
        failed += len(r.failed)
    ks = [k for k in RECALL_KS if k <= top_k]
    return ModeResult(mode=how.name, recall=recall_at_k(ranked, gold, ks),
                      queries_per_s=len(texts) / seconds if seconds > 0 else float("inf"),
                      stage_s=stage, seconds=seconds, dense_fallbacks=fallbacks,
                      ranked_keys=ranked, ppr_max_bound=worst, ppr_refined=refined,
                      failed=failed)


@dataclass
class IRCoTModeResult:
    """One mode's IRCoT evaluation: recall of the merged lists and what the loop did."""

    mode: str
    max_steps: int
    recall: dict[str, float]
    mean_steps: float
    stops: dict[str, int]  # why the loops ended: STOPS -> questions
    thought_requests: int  # thoughts asked of the source (cache hits included)
    retrieval_calls: int
    stage_s: dict[str, float]
    seconds: float
    questions_per_s: float
    ranked_keys: list[list[str]]
    thoughts: list[list[str]]

    def as_dict(self) -> dict[str, Any]:
        return {"max_steps": self.max_steps, "recall": self.recall,
                "mean_steps": round(self.mean_steps, 3), "stops": self.stops,
                "thought_requests": self.thought_requests,
                "retrieval_calls": self.retrieval_calls,
                "stage_s": {k: round(v, 4) for k, v in self.stage_s.items()},
                "seconds": round(self.seconds, 4),
                "questions_per_s": round(self.questions_per_s, 3)}


def evaluate_ircot(
    searcher: Searcher,
    questions: Sequence[Question],
    mode: str | Mode,
    reason: ThoughtSource,
    *,
    max_steps: int = 3,
    top_k: int = 200,
    config: RetrievalConfig | None = None,
    fact_filter: FactFilter | None = None,
    query_entities: Sequence[Sequence[str]] | None = None,
    batch_size: int | None = None,
) -> IRCoTModeResult:
    """IRCoT over all questions (batches of `batch_size`, default all at once): recall@k (k <=
    top_k) of each question's merged list, steps per question, thought requests and the time
    of the retrieval and reasoning stages."""
    how = mode_of(mode)
    texts = [q.question for q in questions]
    gold = [{p.key for p in q.gold} for q in questions]
    _ = searcher.encoder  # load the query encoder outside the timed region
    bs = batch_size or max(len(texts), 1)
    report = IRCoTReport([])
    start = time.perf_counter()
    for i in range(0, len(texts), bs):
        ents = None if query_entities is None else query_entities[i:i + bs]
        report.extend(ircot_retrieve(searcher, texts[i:i + bs], reason, max_steps=max_steps,
                                     top_k=top_k, mode=how, config=config,
                                     fact_filter=fact_filter, query_entities=ents))
    seconds = time.perf_counter() - start
    ranked = [[h.key for h in r.hits] for r in report.results]
    stops = {s: sum(r.stop == s for r in report.results) for s in STOPS}
    n = len(report.results)
    return IRCoTModeResult(
        mode=how.name, max_steps=max_steps,
        recall=recall_at_k(ranked, gold, [k for k in RECALL_KS if k <= top_k]),
        mean_steps=sum(r.steps for r in report.results) / max(n, 1), stops=stops,
        thought_requests=report.thought_requests, retrieval_calls=report.retrieval_calls,
        stage_s=report.stage_seconds, seconds=seconds,
        questions_per_s=n / seconds if seconds > 0 else float("inf"), ranked_keys=ranked,
        thoughts=[r.thoughts for r in report.results])


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, drop punctuation and articles, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """Token-level F1 of normalised strings: 2PR / (P + R) over the multiset overlap."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = Counter(pred) & Counter(ref)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred), overlap / len(ref)
    return 2 * precision * recall / (precision + recall)


def qa_metrics(
    predictions: Sequence[str], gold_answers: Sequence[Sequence[str]]
) -> dict[str, float]:
    """Mean EM and F1 over questions, each the max over the gold answer and its aliases.

    Returns:
        {"em": ..., "f1": ..., "n": Q} with em and f1 in [0, 1].
    """
    if len(predictions) != len(gold_answers):
        raise ValueError(f"{len(predictions)} predictions but {len(gold_answers)} gold lists")
    if not predictions:
        return {"em": 0.0, "f1": 0.0, "n": 0}
    em = [max((exact_match(p, g) for g in golds), default=0.0)
          for p, golds in zip(predictions, gold_answers)]
    f = [max((f1(p, g) for g in golds), default=0.0) for p, golds in zip(predictions, gold_answers)]
    n = len(predictions)
    return {"em": sum(em) / n, "f1": sum(f) / n, "n": n}
