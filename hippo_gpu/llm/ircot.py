"""IRCoTReasoner: the LLM thought source of the IRCoT loop (hippo_gpu.retrieval.ircot).

One call answers one step of every active question: the uncached requests go to the backend
as one batch (the OpenAI backend sends them concurrently, each with the SDK's retries), and each
reply is parsed and cached as it arrives, under a key of the prompt, the model, the generation
settings and the request (question, passages, thoughts so far), so a rerun (a resumed batch
job) gets the same thoughts without calling the LLM.

A reply becomes a thought by `parse_thought`: surrounding whitespace and a leading "Thought:"
label are dropped and runs of whitespace become one space (a thought is also a retrieval query).
An empty reply, or one longer than `max_chars`, is unusable: that question's thought fails with
the reason ("empty_thought", "thought_too_long"), as does a failed call (its backend reason,
e.g. "http_500"), and the loop ends that question with what it has. Failures are counted in
`failures` and never cached as answers (the cache's rule: a failed entry is retried).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hippo_gpu.llm.backends import Backend, ChatRequest, Completion, canonical_json
from hippo_gpu.llm.cache import LLMCache, cache_key
from hippo_gpu.llm.ircot_prompts import ircot_prompt
from hippo_gpu.llm.llm_step import LLMStep
from hippo_gpu.llm.prompts import PromptTemplate
from hippo_gpu.retrieval.ircot import Thought, ThoughtRequest

__all__ = ["IRCoTReasoner", "ReasonerSpec", "parse_thought"]

_LABEL = re.compile(r"^(?:thought\s*:\s*)+", re.IGNORECASE)


def parse_thought(text: str | None, max_chars: int = 4_000) -> Thought:
    """A reply -> a Thought (see the module docstring for the rule)."""
    flat = " ".join((text or "").split())
    flat = _LABEL.sub("", flat).strip()
    if not flat:
        return Thought(None, "empty_thought")
    if len(flat) > max_chars:
        return Thought(None, "thought_too_long")
    return Thought(flat)


class IRCoTReasoner(LLMStep):
    """Callable `(requests) -> thoughts`, one wave of LLM calls per step (a ThoughtSource).

    Args:
        backend: a `Backend` or a spec string (then this object owns and closes it).
        cache: an `LLMCache`, a cache path, or None.
        prompt: the prompt template (default: `ircot_prompt(dataset)`).
        dataset: picks the default prompt (musique, 2wikimultihopqa, hotpotqa, else generic).
        max_passages: passages of each request shown to the LLM (None: all, as upstream, which
            shows ranked[:k]); a cap keeps a long ranking within a small model's context.
        max_tokens: generation cap per thought.
        temperature: sampling temperature (0: greedy).
        max_chars: longest usable thought, in characters.

    Attributes:
        calls: LLM requests sent (cache hits excluded), since construction.
        cached: thoughts answered from the cache.
        failures: failure reason -> count.
    """

    def __init__(
        self,
        backend: Backend | str,
        cache: LLMCache | str | Path | None = None,
        *,
        prompt: PromptTemplate | None = None,
        dataset: str | None = None,
        max_passages: int | None = None,
        max_tokens: int = 128,
        temperature: float = 0.0,
        max_chars: int = 4_000,
    ) -> None:
        if max_passages is not None and max_passages < 0:
            raise ValueError(f"max_passages must be >= 0, got {max_passages}")
        super().__init__(backend, cache)
        self.prompt = prompt or ircot_prompt(dataset)
        self.max_passages = max_passages
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.max_chars = max_chars
        self.calls = 0
        self.cached = 0
        self.failures: Counter[str] = Counter()

    @property
    def identity(self) -> Mapping[str, Any]:
        """What decides the thoughts: model, prompt key and generation settings."""
        return {"model": self.backend.model, "prompt": self.prompt.key, **self._params()}

    def _params(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "temperature": self.temperature,
                "max_passages": self.max_passages, "max_chars": self.max_chars}

    def request(self, r: ThoughtRequest) -> ChatRequest:
        """The chat request of one reasoning step."""
        shown = r.passages if self.max_passages is None else r.passages[: self.max_passages]
        context = "".join(f"Wikipedia Title: {p}\n\n" for p in shown)
        return ChatRequest(self.prompt.render(context=context, question=r.question,
                                              thoughts=" ".join(r.thoughts)),
                           max_tokens=self.max_tokens, temperature=self.temperature)

    def _key(self, r: ThoughtRequest) -> str:
        shown = r.passages if self.max_passages is None else r.passages[: self.max_passages]
        return cache_key("ircot", self.prompt.key, self.backend.model, self._params(),
                         canonical_json([r.question, list(shown), list(r.thoughts)]))

    def __call__(self, requests: Sequence[ThoughtRequest]) -> list[Thought]:
        keys = [self._key(r) for r in requests]
        out: list[Thought | None] = [None] * len(requests)
        todo = []
        for i, key in enumerate(keys):
            hit = self.cache.get_ok(key) if self.cache is not None else None
            if isinstance(hit, str):
                out[i] = Thought(hit)
                self.cached += 1
            else:
                todo.append(i)

        def on_result(j: int, c: Completion) -> None:
            i = todo[j]
            thought = parse_thought(c.text, self.max_chars) if c.ok else \
                Thought(None, c.error or "no_reply")
            out[i] = thought
            if thought.text is None:
                self.failures[thought.error or "no_reply"] += 1
            elif self.cache is not None:
                self.cache.put_ok(keys[i], "ircot", thought.text, prompt_tokens=c.prompt_tokens,
                                  completion_tokens=c.completion_tokens)

        self.calls += len(todo)
        if todo:
            self.backend.generate([self.request(requests[i]) for i in todo], on_result)
        return [t if t is not None else Thought(None, "not_run") for t in out]


@dataclass(frozen=True)
class ReasonerSpec:
    """What opens an IRCoTReasoner elsewhere (a Ray Serve replica): plain, picklable values.

    Args:
        llm: backend spec string (e.g. "openai:MODEL@URL"); the opened reasoner owns it.
        cache: cache path on the opening machine, or None (no cache: a replica on another
            node must not share one SQLite file over network storage).
        prompt: the prompt template (None: the dataset's).
        dataset: picks the default prompt.
        max_passages: passages shown per thought (None: all).
    """

    llm: str
    cache: Path | None = None
    prompt: PromptTemplate | None = None
    dataset: str | None = None
    max_passages: int | None = None

    def open(self) -> IRCoTReasoner:
        return IRCoTReasoner(self.llm, self.cache, prompt=self.prompt, dataset=self.dataset,
                             max_passages=self.max_passages)
