"""Crash-safe OpenIE over a corpus -> HippoRAG v2 OpenIE JSON.

Per passage, two LLM calls as in HippoRAG: NER, then triples conditioned on the entities. Each
call's result is committed to the SQLite cache the moment it arrives, so a run killed at any point
(SIGKILL included) keeps every finished passage, and the next run with the same cache only sends
the passages that are unfinished or failed. The output file is rewritten atomically at the end of
every run and always covers every passage: a failed passage has empty lists and an `error`.

Output (v2): {"docs": [{"idx": "chunk-<md5>", "passage": title + "\\n" + text,
"extracted_entities": [...], "extracted_triples": [[s, p, o], ...], ("error": reason)}],
"avg_ent_chars": float, "avg_ent_words": float}
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hippo_gpu.data import OpenIEDoc, Passage, as_passages
from hippo_gpu.llm.backends import Backend, ChatRequest, Completion, make_backend
from hippo_gpu.llm.cache import LLMCache, cache_key
from hippo_gpu.llm.parse import Limits, OutputRejected, ParseStats, parse_entities, parse_triples
from hippo_gpu.llm.prompts import OPENIE_NER, OPENIE_TRIPLES, entity_schema, triple_schema
from hippo_gpu.progress import progress
from hippo_gpu.storage.durable import write_atomic


@dataclass(frozen=True)
class OpenIEConfig:
    """Generation settings of OpenIE; all of them are part of the cache key.

    Attributes:
        max_entities: cap on entities per passage (schema `maxItems`).
        max_triples: cap on triples per passage (schema `maxItems`).
        max_item_chars: cap on one entity / triple element (schema `maxLength`).
        ner_max_tokens: generation cap of the NER call.
        triple_max_tokens: generation cap of the triple call.
        temperature: sampling temperature (0 = greedy, as HippoRAG).
        use_schema: constrain output with a JSON schema where the backend supports it.
    """

    max_entities: int = 32
    max_triples: int = 48
    max_item_chars: int = 120
    ner_max_tokens: int = 512
    triple_max_tokens: int = 1536
    temperature: float = 0.0
    use_schema: bool = True

    def __post_init__(self) -> None:
        for name in ("max_entities", "max_triples", "max_item_chars", "ner_max_tokens",
                     "triple_max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"OpenIEConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ValueError(f"OpenIEConfig.temperature must be >= 0, got {self.temperature}")

    @property
    def limits(self) -> Limits:
        return Limits(
            max_items=max(self.max_entities, self.max_triples),
            max_item_chars=self.max_item_chars,
        )

    def ner_request(self, content: str) -> ChatRequest:
        schema = entity_schema(self.max_entities, self.max_item_chars)
        return ChatRequest(
            OPENIE_NER.render(passage=content),
            max_tokens=self.ner_max_tokens,
            temperature=self.temperature,
            json_schema=schema if self.use_schema else None,
            schema_name="named_entities",
        )

    def triple_request(self, content: str, entities: list[str]) -> ChatRequest:
        schema = triple_schema(self.max_triples, self.max_item_chars)
        return ChatRequest(
            OPENIE_TRIPLES.render(passage=content, entities=json.dumps(entities)),
            max_tokens=self.triple_max_tokens,
            temperature=self.temperature,
            json_schema=schema if self.use_schema else None,
            schema_name="triples",
        )


@dataclass
class ExtractReport:
    """What one extraction run did.

    `done` passages were extracted by this run, `cached` came from the cache, `failed` are in
    the output with an `error` (reasons in `failures`); parse rejections and repairs are counted
    by reason in `parse`. Throughput counts this run's LLM work only. `docs` (filled by
    extract_openie) is the output itself: one OpenIEDoc per passage in corpus order, what
    read_openie gives for the file written (not part of `as_dict`).
    """

    passages: int = 0
    done: int = 0
    cached: int = 0
    failed: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    parse: ParseStats = field(default_factory=ParseStats)
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    out_path: str = ""
    cache_path: str = ""
    docs: list[OpenIEDoc] = field(default_factory=list, repr=False)

    @property
    def rejected(self) -> dict[str, int]:
        """Parse rejections by reason."""
        return dict(self.parse.rejected)

    @property
    def passages_per_s(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second."""
        return self.completion_tokens / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        failures = f" ({dict(self.failures)}; rerun to retry)" if self.failures else ""
        return (f"OpenIE: {self.passages} passages, {self.done} extracted, {self.cached} cached, "
                f"{self.failed} failed{failures}; {self.passages_per_s:.3f} passages/s, "
                f"{self.tokens_per_s:.1f} tokens/s; parse rejections {dict(self.parse.rejected)}")

    def as_dict(self) -> dict[str, Any]:
        out = asdict(replace(self, docs=[]))
        del out["docs"]
        out["failures"] = dict(self.failures)
        out["parse"] = self.parse.as_dict()
        out["passages_per_s"] = round(self.passages_per_s, 4)
        out["tokens_per_s"] = round(self.tokens_per_s, 2)
        return out


class _Run:
    """State of one extraction run: keys, cache writes, counters."""

    def __init__(self, backend: Backend, cache: LLMCache, cfg: OpenIEConfig) -> None:
        self.backend, self.cache, self.cfg = backend, cache, cfg
        self.report = ExtractReport()
        self.ner_params = {"cfg": asdict(cfg), "stage": "ner"}
        self.triple_params = {"cfg": asdict(cfg), "stage": "triples", "ner": OPENIE_NER.key}
        self.errors: dict[str, str] = {}  # passage key -> reason (this run)
        self.results: dict[str, dict[str, Any]] = {}  # passage key -> {entities, triples}
        self.t0 = time.perf_counter()

    def ner_key(self, p: Passage) -> str:
        return cache_key("openie-ner", OPENIE_NER.key, self.backend.model, self.ner_params,
                         p.content)

    def triple_key(self, p: Passage) -> str:
        return cache_key("openie-triples", OPENIE_TRIPLES.key, self.backend.model,
                         self.triple_params, p.content)

    def count(self, completion: Completion) -> None:
        self.report.requests += 1
        self.report.prompt_tokens += completion.prompt_tokens
        self.report.completion_tokens += completion.completion_tokens

    def fail(self, key: str, cache_key_: str, reason: str, c: Completion) -> None:
        self.errors[key] = reason
        self.report.failures[reason] += 1
        self.cache.put_failed(cache_key_, "openie", reason, prompt_tokens=c.prompt_tokens,
                              completion_tokens=c.completion_tokens)

    def run_ner(self, wave: list[Passage]) -> dict[str, list[str]]:
        """NER for a wave; returns passage key -> entities for the passages that succeeded."""
        found: dict[str, list[str]] = {}

        def on_result(i: int, c: Completion) -> None:
            p = wave[i]
            self.count(c)
            if not c.ok:
                self.fail(p.key, self.ner_key(p), f"ner:{c.error}", c)
                return
            try:
                entities = parse_entities(c.text, limits=self.cfg.limits, stats=self.report.parse)
            except OutputRejected as e:
                self.fail(p.key, self.ner_key(p), f"ner:{e.reason}", c)
                return
            entities = entities[: self.cfg.max_entities]
            self.cache.put_ok(self.ner_key(p), "openie-ner", entities,
                              prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens)
            found[p.key] = entities

        self.backend.generate([self.cfg.ner_request(p.content) for p in wave], on_result)
        return found

    def run_triples(self, wave: list[Passage], entities: dict[str, list[str]], bar: Any) -> None:
        def on_result(i: int, c: Completion) -> None:
            p = wave[i]
            self.count(c)
            reason = None
            if not c.ok:
                reason = f"triples:{c.error}"
            else:
                try:
                    triples = parse_triples(c.text, limits=self.cfg.limits,
                                            stats=self.report.parse)
                except OutputRejected as e:
                    reason = f"triples:{e.reason}"
            if reason is not None:
                self.fail(p.key, self.triple_key(p), reason, c)
            else:
                value = {"entities": entities[p.key],
                         "triples": triples[: self.cfg.max_triples]}
                self.cache.put_ok(self.triple_key(p), "openie", value,
                                  prompt_tokens=c.prompt_tokens,
                                  completion_tokens=c.completion_tokens)
                self.results[p.key] = value
                self.report.done += 1
            self.tick(bar)

        requests = [self.cfg.triple_request(p.content, entities[p.key]) for p in wave]
        self.backend.generate(requests, on_result)

    def tick(self, bar: Any, n: int = 1) -> None:
        bar.update(n)
        elapsed = max(time.perf_counter() - self.t0, 1e-9)
        bar.set_postfix(
            psg_s=f"{self.report.done / elapsed:.2f}",
            tok_s=f"{self.report.completion_tokens / elapsed:.1f}",
            failed=len(self.errors),
            refresh=False,
        )


def extract_openie(
    corpus: str | Path | Sequence[Passage] | Sequence[dict[str, Any]],
    backend_spec: str | Backend,
    out_path: str | Path | None,
    *,
    cache_path: str | Path | None = None,
    config: OpenIEConfig | None = None,
    wave_size: int = 64,
    show_progress: bool = True,
    backend_options: dict[str, Any] | None = None,
) -> ExtractReport:
    """Run OpenIE over every passage not already in the cache; return the docs in the report
    and write the v2 JSON atomically (unless `out_path` is None).

    Args:
        corpus: corpus JSON path, or passages ({title, text} dicts or `Passage` objects).
        backend_spec: "openai:MODEL@URL", "vllm:MODEL", "local:smollm2", or a `Backend`
            (which the caller keeps and closes).
        out_path: OpenIE JSON to write, or None to write no file (then `cache_path` is needed).
        cache_path: SQLite cache; default `<out_path>.cache.sqlite`.
        config: generation settings (part of the cache key).
        wave_size: passages sent to the backend per batch; at most one wave's in-flight
            requests are lost on a crash.
        show_progress: tqdm bar with passages/s, tokens/s and failures (only on a terminal).
        backend_options: forwarded to `make_backend` when `backend_spec` is a string.

    Returns:
        ExtractReport (the docs, counts, failures by reason, parse statistics, throughput).
    """
    if wave_size < 1:
        raise ValueError(f"wave_size must be >= 1, got {wave_size}")
    passages = as_passages(corpus)
    out_path = Path(out_path) if out_path is not None else None
    if cache_path is not None:
        cache_file = Path(cache_path)
    elif out_path is not None:
        cache_file = out_path.with_name(out_path.name + ".cache.sqlite")
    else:
        raise ValueError("extract_openie needs a cache_path when it writes no out_path")
    cfg = config or OpenIEConfig()
    owns_backend = not isinstance(backend_spec, Backend)
    backend = make_backend(backend_spec, **(backend_options or {}))
    try:
        with LLMCache(cache_file) as cache:
            run = _Run(backend, cache, cfg)
            report = run.report
            report.passages, report.out_path, report.cache_path = (
                len(passages), str(out_path or ""), str(cache_file))
            run.t0 = time.perf_counter()
            todo = uncached_passages(cache, run.triple_key, passages, run.results, run.report)
            with progress(total=len(todo), desc="openie", unit="psg",
                          disable=not show_progress) as bar:
                for lo in range(0, len(todo), wave_size):
                    _run_wave(run, cache, todo[lo : lo + wave_size], bar)
            report.seconds = time.perf_counter() - run.t0
            report.failed = len(run.errors)
            if out_path is not None:
                write_openie(out_path, passages, run.results, run.errors)
            report.docs = openie_docs(passages, run.results, run.errors)
    finally:
        if owns_backend:
            backend.close()
    return report


def uncached_passages(cache: LLMCache, triple_key: Callable[[Passage], str],
                      passages: Sequence[Passage], results: dict[str, dict[str, Any]],
                      report: ExtractReport) -> list[Passage]:
    """The passages whose triples the cache does not hold (to send to the LLM); the cached ones
    go into ``results`` (by passage key) and count in ``report.cached``. One read of the cache
    for the whole list (local and Ray extraction alike)."""
    entries = cache.get_many([triple_key(p) for p in passages])
    todo: list[Passage] = []
    for p in passages:
        entry = entries.get(triple_key(p))
        if entry is not None and entry.status == "ok":
            results[p.key] = entry.value
            report.cached += 1
        else:
            todo.append(p)
    return todo


def _run_wave(run: _Run, cache: LLMCache, wave: list[Passage], bar: Any) -> None:
    """One wave: NER for the passages whose entities are not cached, then triples for every
    passage that has entities."""
    ner_entries = cache.get_many([run.ner_key(p) for p in wave])
    entities: dict[str, list[str]] = {}
    need_ner = []
    for p in wave:
        entry = ner_entries.get(run.ner_key(p))
        if entry is not None and entry.status == "ok":
            entities[p.key] = entry.value
        else:
            need_ner.append(p)
    if need_ner:
        entities.update(run.run_ner(need_ner))
        run.tick(bar, sum(1 for p in need_ner if p.key in run.errors))
    ready = [p for p in wave if p.key in entities]
    if ready:
        run.run_triples(ready, entities, bar)


def openie_document(
    passages: Sequence[Passage],
    results: dict[str, dict[str, Any]],
    errors: dict[str, str],
) -> dict[str, Any]:
    """The v2 OpenIE object for `passages` (corpus order); a passage without a result is failed.

    avg_ent_chars / avg_ent_words are means over all extracted entities (0.0 if none).
    """
    docs = []
    all_entities: list[str] = []
    for p in passages:
        result = results.get(p.key)
        doc: dict[str, Any] = {"idx": p.key, "passage": p.content}
        if result is None:
            doc.update(extracted_entities=[], extracted_triples=[],
                       error=errors.get(p.key, "not_extracted"))
        else:
            doc.update(extracted_entities=list(result["entities"]),
                       extracted_triples=[list(t) for t in result["triples"]])
            all_entities.extend(result["entities"])
        docs.append(doc)
    n = len(all_entities)
    return {
        "docs": docs,
        "avg_ent_chars": round(sum(len(e) for e in all_entities) / n, 4) if n else 0.0,
        "avg_ent_words": round(sum(len(e.split()) for e in all_entities) / n, 4) if n else 0.0,
    }


def openie_docs(
    passages: Sequence[Passage],
    results: dict[str, dict[str, Any]],
    errors: dict[str, str],
) -> list[OpenIEDoc]:
    """The docs of `openie_document`, checked as read_openie checks them in the file."""
    return [OpenIEDoc.from_raw(d["extracted_entities"], d["extracted_triples"], d.get("error"))
            for d in openie_document(passages, results, errors)["docs"]]


def write_openie(
    out_path: str | Path,
    passages: Sequence[Passage],
    results: dict[str, dict[str, Any]],
    errors: dict[str, str],
) -> None:
    """Write the v2 OpenIE JSON atomically (storage.durable.write_atomic: readers see the old
    file or the new one, never a partial one)."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    document = openie_document(passages, results, errors)

    def dump(tmp: Path) -> None:
        with tmp.open("w", encoding="utf-8") as f:
            json.dump(document, f, ensure_ascii=False)

    write_atomic(out_path, dump)
