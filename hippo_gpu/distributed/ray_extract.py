"""OpenIE over several OpenAI-compatible endpoints with Ray tasks (`hippo-gpu extract --ray`).

The corpus's unfinished passages are cut into shards of `shard_size`; shard k is one Ray task
that talks to endpoint k mod E (round-robin) and runs the local extraction
(hippo_gpu.llm.extract.extract_openie, unchanged: NER then triples, the backend's own HTTP
retries, parse rules). The result equals the local `extract` for the same replies: the same
cache keys, the same values, the same OpenIE JSON writer.

The cache belongs to the driver. One SQLite file (WAL) at a local path of the driver, with the
local command's content-addressed keys; Ray tasks never open it, so the run works the same on
one machine and on many (SQLite must not be shared over a network file system). The driver:

1. reads the cache: a passage whose triples are cached is done and never sent again; a passage
   whose NER is cached gets that entry shipped with its shard (its NER is not redone);
2. runs each shard in a task with a private cache in the task's temporary folder, seeded with
   those entries; the task returns the shard's documents and every new cache entry;
3. commits a finished shard's entries into its cache as soon as the shard returns (one
   transaction per entry, as the local command), so a driver killed at any point keeps every
   finished shard, and the next run sends only the rest (resume). Each passage is in one shard
   of a round, so no passage is extracted twice by a run, and none that a run finished is
   extracted again;
4. after a round, sends the passages that failed (timeouts, HTTP errors, dead endpoints,
   rejected output) once more, each shard to the next endpoint (`retry_rounds`); what still
   fails is in the output with its `error` and in the cache as failed, and a rerun retries it.

A task whose worker dies is rerun by Ray (`max_task_retries`); its private cache dies with it,
so at most the shard's in-flight work is redone, like a wave of the local command. A lost node
is the same for each shard that was running there: the task fails once the cluster declares the
node dead (about 15 s with Ray's default health checks), is rerun on another node, and only its
passages are asked of the LLM again; the output still holds each passage once
(tests/distributed/test_ray_multinode.py).
Only `openai:` specs are accepted, all naming the same model (the model is part of every cache
key); an engine in each task (vllm:, local:) is not supported here.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from hippo_gpu.data import Passage, as_passages
from hippo_gpu.llm.backends import Backend, BackendSpecError, ChatRequest, Completion
from hippo_gpu.llm.backends.base import OnResult, parse_spec
from hippo_gpu.llm.cache import LLMCache
from hippo_gpu.llm.extract import (
    ExtractReport,
    OpenIEConfig,
    _Run,
    extract_openie,
    uncached_passages,
    write_openie,
)
from hippo_gpu.progress import progress

__all__ = ["extract_openie_ray"]

# (key, task, status, value as JSON text or None, error, prompt_tokens, completion_tokens)
Entry = tuple[str, str, str, str | None, str | None, int, int]


class _KeyOnly(Backend):
    """Stands in for the endpoints where only the model name is needed: the cache keys."""

    def __init__(self, model: str) -> None:
        self.model = model

    def generate(self, requests: Sequence[ChatRequest],
                 on_result: OnResult | None = None) -> list[Completion]:
        raise RuntimeError("the driver computes cache keys only; shards talk to the LLM")


def _model_of(specs: Sequence[str]) -> str:
    if not specs:
        raise BackendSpecError("give at least one LLM endpoint")
    parsed = [parse_spec(s) for s in specs]
    if any(p.kind != "openai" for p in parsed):
        raise BackendSpecError("extract --ray takes openai:MODEL@URL endpoints only")
    models = {p.model for p in parsed}
    if len(models) != 1:
        raise BackendSpecError(f"all endpoints must serve one model (it is part of every "
                               f"cache key); got {sorted(models)}")
    return models.pop()


def _run_shard(passages: list[Passage], spec: str, seeds: list[Entry], cfg: OpenIEConfig,
               wave_size: int, options: dict[str, Any]) -> dict[str, Any]:
    """One shard, in a Ray worker: extract into a private cache; return docs and new entries."""
    with tempfile.TemporaryDirectory(prefix="hippo-gpu-shard-") as tmp:
        cache_file, out = Path(tmp) / "cache.sqlite", Path(tmp) / "openie.json"
        with LLMCache(cache_file) as cache:
            for key, task, _, value, _, pt, ct in seeds:
                cache.put_ok(key, task, json.loads(value or "null"), prompt_tokens=pt,
                             completion_tokens=ct)
        report = extract_openie(passages, spec, out, cache_path=cache_file, config=cfg,
                                wave_size=wave_size, show_progress=False,
                                backend_options=options)
        docs = json.loads(out.read_text(encoding="utf-8"))["docs"]
        seeded = {s[0] for s in seeds}
        db = sqlite3.connect(cache_file)
        try:
            rows = db.execute("SELECT key, task, status, value, error, prompt_tokens, "
                              "completion_tokens FROM results").fetchall()
        finally:
            db.close()
    return {"docs": docs, "entries": [tuple(r) for r in rows if r[0] not in seeded],
            "report": report}


def _commit(cache: LLMCache, entries: list[Entry]) -> None:
    for key, task, status, value, error, pt, ct in entries:
        if status == "ok":
            cache.put_ok(key, task, json.loads(value or "null"), prompt_tokens=pt,
                         completion_tokens=ct)
        else:
            cache.put_failed(key, task, error or "unknown", prompt_tokens=pt,
                             completion_tokens=ct)


def extract_openie_ray(
    corpus: str | Path | Sequence[Passage] | Sequence[dict[str, Any]],
    specs: Sequence[str],
    out_path: str | Path,
    *,
    cache_path: str | Path | None = None,
    config: OpenIEConfig | None = None,
    shard_size: int = 64,
    wave_size: int = 64,
    workers: int | None = None,
    retry_rounds: int = 1,
    cpus_per_task: float = 0.25,
    max_task_retries: int = 3,
    backend_options: dict[str, Any] | None = None,
    show_progress: bool = True,
) -> ExtractReport:
    """OpenIE of every passage not in the cache, sharded over Ray tasks and `specs`'
    endpoints; write the v2 JSON atomically (see the module docstring).

    Args:
        corpus: corpus JSON path, or passages ({title, text} dicts or `Passage` objects).
        specs: "openai:MODEL@URL" endpoints serving one model; shard k uses specs[k % E].
        out_path: OpenIE JSON to write.
        cache_path: the driver's SQLite cache; default `<out_path>.cache.sqlite` (as local).
        config: generation settings (part of the cache key).
        shard_size: passages per Ray task (what a dead worker may cost again).
        wave_size: passages per backend batch inside a task.
        workers: shards in flight at once (default: one per endpoint).
        retry_rounds: times the failed passages are sent again, to the next endpoint.
        cpus_per_task: Ray CPUs one task reserves (the work is waiting on HTTP).
        max_task_retries: Ray reruns of a task whose worker died.
        backend_options: forwarded to each task's `make_backend` (concurrency, timeout, key).

    Returns:
        ExtractReport over the whole run (failures: the passages that failed in the end).
    """
    if min(shard_size, wave_size) < 1 or retry_rounds < 0:
        raise ValueError("shard_size and wave_size must be >= 1, retry_rounds >= 0")
    model = _model_of(specs)
    passages = as_passages(corpus)
    out_path = Path(out_path)
    cache_file = Path(cache_path) if cache_path is not None else \
        out_path.with_name(out_path.name + ".cache.sqlite")
    cfg = config or OpenIEConfig()
    task = ray.remote(_run_shard).options(num_cpus=cpus_per_task, max_retries=max_task_retries)
    report = ExtractReport(passages=len(passages), out_path=str(out_path),
                           cache_path=str(cache_file))
    t0 = time.perf_counter()
    with LLMCache(cache_file) as cache:
        shards = _Shards(task, list(specs), cache, _Run(_KeyOnly(model), cache, cfg), cfg,
                         wave_size, backend_options or {}, report)
        pending = shards.read_cache(passages)
        with progress(total=len(pending), desc="openie", unit="psg",
                      disable=not show_progress) as bar:
            for round_ in range(retry_rounds + 1):
                if not pending:
                    break
                shards.run_round(pending, round_, shard_size=shard_size,
                                 workers=workers or len(specs), bar=bar)
                pending = [p for p in pending if p.key in shards.errors]
    report.seconds = time.perf_counter() - t0
    report.failed = len(shards.errors)
    report.failures = Counter(shards.errors.values())
    write_openie(out_path, passages, shards.results, shards.errors)
    return report


@dataclass
class _Shards:
    """The driver's side of a run: the cache it owns, the shards it sends round-robin over
    the endpoints, and what came back (results and errors by passage key)."""

    task: Any  # the Ray remote function of _run_shard
    specs: list[str]
    cache: LLMCache
    keys: _Run  # the cache keys of the local command
    cfg: OpenIEConfig
    wave_size: int
    options: dict[str, Any]
    report: ExtractReport
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def read_cache(self, passages: list[Passage]) -> list[Passage]:
        """The passages whose triples are not cached (to send); the cached ones are results."""
        return uncached_passages(self.cache, self.keys.triple_key, passages, self.results,
                                 self.report)

    def run_round(self, pending: list[Passage], round_: int, *, shard_size: int, workers: int,
                  bar: Any) -> None:
        """`pending` in shards of `shard_size`, `workers` in flight; shard k goes to endpoint
        (k + round_) mod E; each shard's entries are committed as soon as it returns."""
        for p in pending:
            self.errors.pop(p.key, None)
        shards = [pending[i:i + shard_size] for i in range(0, len(pending), shard_size)]
        running: dict[Any, int] = {}
        nxt = 0
        while nxt < len(shards) or running:
            while nxt < len(shards) and len(running) < workers:
                spec = self.specs[(nxt + round_) % len(self.specs)]
                running[self.submit(shards[nxt], spec)] = nxt
                nxt += 1
            ready, _ = ray.wait(list(running), num_returns=1)
            running.pop(ready[0])
            bar.update(self.collect(ray.get(ready[0])))

    def submit(self, shard: list[Passage], spec: str) -> Any:
        """One shard's task on endpoint `spec`, seeded with the shard's cached NER."""
        ner = self.cache.get_many([self.keys.ner_key(p) for p in shard])
        seeds: list[Entry] = [
            (e.key, e.task, e.status, json.dumps(e.value), e.error, e.prompt_tokens,
             e.completion_tokens)
            for e in ner.values() if e.status == "ok"]
        return self.task.remote(shard, spec, seeds, self.cfg, self.wave_size, self.options)

    def collect(self, got: dict[str, Any]) -> int:
        """A returned shard: its entries committed, its docs taken; the passages it extracted."""
        _commit(self.cache, got["entries"])
        _merge(self.report, got["report"])
        for doc in got["docs"]:
            if "error" in doc:
                self.errors[doc["idx"]] = doc["error"]
            else:
                self.results[doc["idx"]] = {"entities": doc["extracted_entities"],
                                            "triples": doc["extracted_triples"]}
        return sum(1 for d in got["docs"] if "error" not in d)


def _merge(into: ExtractReport, part: ExtractReport) -> None:
    into.done += part.done
    into.requests += part.requests
    into.prompt_tokens += part.prompt_tokens
    into.completion_tokens += part.completion_tokens
    into.parse.merge(part.parse)
