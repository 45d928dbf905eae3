"""A scripted OpenAI-compatible chat server on loopback (FastAPI + uvicorn in a thread), for the
IRCoT tests: it reads the question and the thoughts so far out of the reasoning prompt (its last
"Question: ...\\nThought: ..." lines) and answers with that question's next scripted thought.

A script maps a question to its thoughts, in order. A scripted thought may instead be an
action: `HTTP(500)` answers with that status, "" with an empty reply. A question without a
script, or past its script's end, gets "no more thoughts." (a thought that never stops).
Every request is recorded as (question, step) in `requests`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tests.loopback import serve_asgi

_TAIL = re.compile(r"Question: (?P<q>.*)\nThought: ?(?P<t>.*)\Z", re.DOTALL)


@dataclass(frozen=True)
class HTTP:
    status: int


Script = Mapping[str, Sequence[str | HTTP]]


class ScriptedLLM:
    def __init__(self, script: Script) -> None:
        self.script = {q: list(ts) for q, ts in script.items()}
        self.requests: list[tuple[str, int]] = []
        self.prompts: list[list[dict[str, str]]] = []
        self.lock = threading.Lock()
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self._chat)

    def _step(self, question: str, so_far: str) -> int:
        """How many of the question's scripted thoughts the prompt already holds."""
        thoughts = [t for t in self.script.get(question, []) if isinstance(t, str)]
        for n in range(len(thoughts) + 1):
            if " ".join(thoughts[:n]) == so_far.strip():
                return n
        raise AssertionError(f"thoughts so far not from the script: {so_far!r}")

    async def _chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        user = body["messages"][-1]["content"]
        m = _TAIL.search(user)
        assert m is not None, f"not a reasoning prompt: {user[-200:]!r}"
        question, so_far = m.group("q"), m.group("t")
        step = self._step(question, so_far)
        with self.lock:
            self.requests.append((question, step))
            self.prompts.append(body["messages"])
        script = self.script.get(question, [])
        reply = script[step] if step < len(script) else "no more thoughts."
        if isinstance(reply, HTTP):
            return JSONResponse({"error": {"message": "scripted", "type": "x"}},
                                status_code=reply.status)
        return JSONResponse({
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": reply}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        })

    def asked(self, question: str) -> list[int]:
        return [s for q, s in self.requests if q == question]


@contextmanager
def scripted_llm(script: Script) -> Iterator[tuple[ScriptedLLM, str]]:
    """Serve a ScriptedLLM on 127.0.0.1 (a free port); yields (it, its spec string)."""
    llm = ScriptedLLM(script)
    with serve_asgi(llm.app) as (url, _):
        yield llm, f"openai:scripted@{url}/v1"


def fast_backend(spec: str, **options: Any) -> Any:
    """An OpenAIBackend on a scripted server: no retries (a scripted 500 fails at once)."""
    from hippo_gpu.llm.backends import make_backend

    return make_backend(spec, **{"max_retries": 0, "timeout": 10.0, **options})
