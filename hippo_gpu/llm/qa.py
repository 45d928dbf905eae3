"""QA reader (HippoRAG's reading step); its answers are scored by hippo_gpu.evaluate.qa_metrics.

The reader sees the top passages as "Wikipedia Title: {title}\\n{text}\\n\\n" blocks, then
"Question: ...\\nThought: ", and its answer is the text after "Answer:" (as upstream).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from hippo_gpu.llm.backends import Backend, ChatRequest, Completion, canonical_json
from hippo_gpu.llm.cache import LLMCache, cache_key
from hippo_gpu.llm.llm_step import LLMStep
from hippo_gpu.llm.parse import parse_answer
from hippo_gpu.llm.prompts import QA_READER


class QAReader(LLMStep):
    """Callable `(questions, passages) -> answers`, one wave of LLM calls.

    Args:
        backend: a `Backend` or a spec string (then this object owns and closes it).
        cache: an `LLMCache`, a cache path, or None.
        top_k: passages per question fed to the reader (upstream qa_top_k = 5).
        max_tokens: generation cap per question.

    A question whose call fails gets "" (scored 0), counted in `failures`.
    """

    def __init__(
        self,
        backend: Backend | str,
        cache: LLMCache | str | Path | None = None,
        *,
        top_k: int = 5,
        max_tokens: int = 512,
        temperature: float = 0.0,
    ) -> None:
        super().__init__(backend, cache)
        self.top_k = top_k
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.failures: Counter[str] = Counter()

    def request(self, question: str, passages: Sequence[str]) -> ChatRequest:
        """The chat request for one question and its ranked passages (title + "\\n" + text)."""
        context = "".join(f"Wikipedia Title: {p}\n\n" for p in passages[: self.top_k])
        return ChatRequest(
            QA_READER.render(context=context, question=question),
            max_tokens=self.max_tokens,
            temperature=self.temperature,
        )

    def __call__(
        self, questions: Sequence[str], passages: Sequence[Sequence[str]]
    ) -> list[str]:
        if len(questions) != len(passages):
            raise ValueError(f"{len(questions)} questions but {len(passages)} passage lists")
        self.failures = Counter()
        params = {"max_tokens": self.max_tokens, "temperature": self.temperature,
                  "top_k": self.top_k}
        keys = [
            cache_key("qa", QA_READER.key, self.backend.model, params,
                      canonical_json([q, list(ps[: self.top_k])]))
            for q, ps in zip(questions, passages)
        ]
        answers = [""] * len(questions)
        todo = []
        for i, key in enumerate(keys):
            hit = self.cache.get_ok(key) if self.cache is not None else None
            if isinstance(hit, str):
                answers[i] = hit
            else:
                todo.append(i)

        def on_result(j: int, c: Completion) -> None:
            i = todo[j]
            if not c.ok:
                self.failures[str(c.error)] += 1
                return
            answers[i] = parse_answer(c.text)
            if self.cache is not None:
                self.cache.put_ok(keys[i], "qa", answers[i], prompt_tokens=c.prompt_tokens,
                                  completion_tokens=c.completion_tokens)

        self.backend.generate([self.request(questions[i], passages[i]) for i in todo], on_result)
        return answers
