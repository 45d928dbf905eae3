"""Query NER for HippoRAG 1 mode, and a reader for HippoRAG's precomputed query NER files."""

from __future__ import annotations

import csv
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from hippo_gpu.errors import HippoGpuError
from hippo_gpu.llm.backends import Backend, ChatRequest, Completion
from hippo_gpu.llm.cache import LLMCache, cache_key
from hippo_gpu.llm.llm_step import LLMStep
from hippo_gpu.llm.parse import Limits, OutputRejected, ParseStats, parse_entities
from hippo_gpu.llm.prompts import QUERY_NER, entity_schema


class NERFileError(HippoGpuError, ValueError):
    """A query NER TSV lacks its columns or holds a malformed row."""


class QueryNER(LLMStep):
    """Callable `(queries) -> list[list[str]]`: the named entities of each query.

    A query whose call or parse fails gets [] (HippoRAG 1 then scores passages uniformly); the
    failures of the last call are in `failures` (reason -> count), parse counts in `stats`.

    Args:
        backend: a `Backend` or a spec string (then this object owns and closes it).
        cache: an `LLMCache`, a cache path, or None.
        max_entities: schema cap on entities per query.
        max_tokens: generation cap per query.
    """

    def __init__(
        self,
        backend: Backend | str,
        cache: LLMCache | str | Path | None = None,
        *,
        max_entities: int = 16,
        max_tokens: int = 256,
        temperature: float = 0.0,
    ) -> None:
        super().__init__(backend, cache)
        self.max_entities = max_entities
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.failures: Counter[str] = Counter()
        self.stats = ParseStats()

    def _key(self, query: str) -> str:
        params = {"max_entities": self.max_entities, "max_tokens": self.max_tokens,
                  "temperature": self.temperature}
        return cache_key("query-ner", QUERY_NER.key, self.backend.model, params, query)

    def __call__(self, queries: Sequence[str]) -> list[list[str]]:
        self.failures = Counter()
        out: list[list[str]] = [[] for _ in queries]
        todo: list[int] = []
        for q, query in enumerate(queries):
            hit = self.cache.get_ok(self._key(query)) if self.cache is not None else None
            if hit is not None:
                out[q] = [str(e) for e in hit]
            else:
                todo.append(q)

        def on_result(j: int, c: Completion) -> None:
            q = todo[j]
            if not c.ok:
                self.failures[str(c.error)] += 1
                return
            try:
                entities = parse_entities(c.text, limits=Limits(max_items=self.max_entities),
                                          stats=self.stats)
            except OutputRejected as e:
                self.failures[e.reason] += 1
                return
            out[q] = entities
            if self.cache is not None:
                self.cache.put_ok(self._key(queries[q]), "query-ner", entities,
                                  prompt_tokens=c.prompt_tokens,
                                  completion_tokens=c.completion_tokens)

        schema = entity_schema(self.max_entities, 120)
        requests = [
            ChatRequest(QUERY_NER.render(question=queries[q]), max_tokens=self.max_tokens,
                        temperature=self.temperature, json_schema=schema,
                        schema_name="named_entities")
            for q in todo
        ]
        self.backend.generate(requests, on_result)
        return out


def read_query_ner_tsv(path: str | Path, stats: ParseStats | None = None) -> dict[str, list[str]]:
    """Read HippoRAG's `*_queries.named_entity_output.tsv`: question -> named entities.

    The `triples` column holds the NER reply, a JSON object `{"named_entities": [...]}`. It is
    parsed like live LLM output (`json.loads` plus repair, never eval): a row whose cell cannot
    be read maps to [] and is counted in `stats.rejected`.

    Raises:
        NERFileError: the file lacks the `question` or `triples` column.
    """
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    out: dict[str, list[str]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f, delimiter="\t")
        fields = reader.fieldnames or []
        if "question" not in fields or "triples" not in fields:
            raise NERFileError(f"{path}: needs 'question' and 'triples' columns, has {fields}")
        for row in reader:
            try:
                out[row["question"]] = parse_entities(row["triples"], stats=stats)
            except OutputRejected:
                out[row["question"]] = []
    return out
