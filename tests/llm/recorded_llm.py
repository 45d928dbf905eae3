"""Recorded (mocked) LLM replies: a backend that answers from a function of the request and
records every request, and three passages with the replies real models give them (fences,
prose, truncation, wrong arity, a refusal)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hippo_gpu.llm.backends import Backend, ChatRequest, Completion, OnResult


class RecordedBackend(Backend):
    """Replies from a function of the last user message; records every request."""

    def __init__(self, reply: Callable[[ChatRequest], Completion], model: str = "rec") -> None:
        self.model = model
        self.reply = reply
        self.requests: list[ChatRequest] = []

    def generate(self, requests: Sequence[ChatRequest],
                 on_result: OnResult | None = None) -> list[Completion]:
        out = []
        for i, r in enumerate(requests):
            self.requests.append(r)
            c = self.reply(r)
            out.append(c)
            if on_result is not None:
                on_result(i, c)
        return out


def passage_of(request: ChatRequest) -> str:
    user = request.messages[-1]["content"]
    return user.split("Passage:\n", 1)[1].split("\n\nNamed entities:", 1)[0]


def is_ner(request: ChatRequest) -> bool:
    return "Named entities:" not in request.messages[-1]["content"]


CORPUS = [
    {"title": "Alpha", "text": "Alpha was founded by Beta in 1901."},
    {"title": "Gamma", "text": "Gamma lies in Delta."},
    {"title": "Epsilon", "text": "Epsilon wrote Zeta."},
]
# Recorded replies with the defects real models produce: fences, prose, truncation, arity.
REPLIES = {
    "Alpha": ('```json\n{"named_entities": ["Alpha", "Beta", "1901"]}\n```',
              'Here: {"triples": [["Alpha", "founded by", "Beta"], ["Alpha", "founded in", 1901],'
              ' ["Alpha", "x"], ["Alpha", "founded by", "Beta"]]}'),
    "Gamma": ('{"named_entities": ["Gamma", "Delta"]}',
              '{"triples": [["Gamma", "lies in", "Delta"], ["Gam'),
    "Epsilon": ("I cannot help with that.", '{"triples": []}'),
}


def recorded(request: ChatRequest) -> Completion:
    title = passage_of(request).split("\n", 1)[0]
    ner, triples = REPLIES[title]
    return Completion(ner if is_ner(request) else triples, prompt_tokens=50,
                      completion_tokens=20)
