"""IRCoT requests: the batched loop (hippo_gpu.retrieval.ircot.run_ircot) over the service's
micro-batcher.

A request with `"ircot": {"max_steps": S}` runs `run_ircot` on a worker thread (the thought
source's LLM calls block, and must not block the event loop). Each step's retrieval of the
request's active queries is ONE submission to the index's micro-batcher, from that thread onto
the event loop, so thoughts of concurrent IRCoT requests, and plain queries with the same batch
key, share batched `Searcher` calls; a query's ranking does not depend on its batch, so each
query gets what `hippo_gpu.retrieval.ircot.ircot_retrieve` gives it offline with the same thoughts.

The question's own retrieval uses the request's entities and return_seeds (the seeds returned
are its own); a thought's retrieval uses none (hipporag1 and hybrid: the LLM-free extractor's
capitalised spans of the thought, the Searcher's default). A write that commits during a request may
switch the index version between its steps: the batcher answers each step from the current
version, and the answers name a version only when every step of the request read that one
(else None: the response's "version" is then null).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from hippo_gpu.retrieval.ircot import IRCoTResult, Retrieved, ThoughtSource, run_ircot
from hippo_gpu.retrieval.modes import Mode
from hippo_gpu.retrieval.results import Hit, label_fields
from hippo_gpu.serve.service import Answer, RetrievalService, answered_version

__all__ = ["answer_ircot", "trace"]


async def answer_ircot(service: RetrievalService, reason: ThoughtSource, queries: Sequence[str],
                       *, top_k: int, mode: Mode, max_steps: int,
                       entities: Sequence[Sequence[str]] | None = None,
                       return_seeds: bool = False, index: str | None = None,
                       transport: str = "http", where: dict[str, Any] | None = None
                       ) -> tuple[list[Answer], list[IRCoTResult]]:
    """(one Answer per query: its merged hits, its own seeds, its error when its own retrieval
    failed; the IRCoT results). Raises what `RetrievalService.retrieve` raises."""
    loop = asyncio.get_running_loop()
    texts: dict[str, str] = {}  # passage key -> text, for the prompts and the answers
    seeds: list[Any] = [None] * len(queries)
    step_answers: list[Answer] = []  # every step's, for the version they name

    def retrieve(batch: list[str], step: int) -> list[Retrieved]:
        ents = entities if step == 0 else None
        answers = asyncio.run_coroutine_threadsafe(service.retrieve(
            batch, top_k=top_k, mode=mode, entities=ents, return_seeds=return_seeds and step == 0,
            index=index, transport=transport, where=where), loop).result()
        if step == 0:
            seeds[:] = [a.seeds for a in answers]
        step_answers.extend(answers)
        out = []
        for a in answers:
            texts.update((h["key"], h["text"]) for h in a.hits)
            out.append(Retrieved([Hit(h["key"], h["title"], h["score"], h["rank"], -1,
                                      h.get("id"), h.get("metadata"))
                                  for h in a.hits], a.error))
        return out

    report = await asyncio.to_thread(run_ircot, list(queries), retrieve, reason,
                                     lambda h: texts[h.key], max_steps=max_steps, top_k=top_k)
    version = answered_version(step_answers)
    answers = [
        Answer([{"key": h.key, "title": h.title, "text": texts[h.key], "score": h.score,
                 "rank": h.rank, **label_fields(h.id, h.metadata)} for h in r.hits],
               seeds[i], r.error if r.failed else None,
               version=version)
        for i, r in enumerate(report.results)
    ]
    return answers, report.results


def trace(result: IRCoTResult) -> dict[str, Any]:
    """A result's IRCoT trace as the response carries it (schema.IRCoTTrace)."""
    return {"thoughts": result.thoughts, "steps": result.steps, "stop": result.stop,
            "error": result.error}
