"""OpenAI-compatible HTTP backend: async, bounded concurrency, timeouts, retries with jitter.

Works against OpenAI, vLLM's server, llama.cpp's server, SGLang, TGI and the like. The `openai`
package is imported lazily, on first use.

Retry policy: timeouts, connection errors, HTTP 408/409/429 and 5xx are retried up to
`max_retries` times, sleeping `min(max_backoff, backoff * 2**attempt) * U(0.5, 1)` between tries
(exponential backoff with jitter, so a crowd of clients does not retry in lockstep). Other HTTP
errors fail the request at once. A server that rejects `response_format` is asked again with a
weaker mode (json_schema -> json_object -> none) and that mode is kept for later calls.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Sequence
from typing import Any

from hippo_gpu.llm.backends.base import Backend, ChatRequest, Completion, OnResult

_SCHEMA_MODES = ("json_schema", "json_object", "none")
_RETRY_STATUS = {408, 409, 429}


class OpenAIBackend(Backend):
    """Chat completions over HTTP with the async `openai` client.

    Args:
        model: model name sent to the server.
        base_url: e.g. "http://127.0.0.1:8000/v1".
        api_key: bearer token; local servers accept any value.
        concurrency: requests in flight at once.
        timeout: seconds per HTTP attempt.
        max_retries: extra attempts for retryable failures.
        backoff: base of the exponential backoff, seconds.
        max_backoff: cap on one sleep, seconds.
        use_schema: send `response_format` when a request carries a JSON schema.
        seed: random seed of the jitter (tests).
    """

    def __init__(
        self,
        model: str,
        base_url: str,
        *,
        api_key: str | None = None,
        concurrency: int = 16,
        timeout: float = 120.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 16.0,
        use_schema: bool = True,
        seed: int | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.model = model
        self.base_url = base_url
        self.api_key = api_key or "EMPTY"
        self.concurrency = concurrency
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._schema_mode = "json_schema" if use_schema else "none"
        self._rng = random.Random(seed)

    @property
    def schema_mode(self) -> str:
        """The `response_format` mode in use: json_schema, json_object or none."""
        return self._schema_mode

    def generate(
        self, requests: Sequence[ChatRequest], on_result: OnResult | None = None
    ) -> list[Completion]:
        """Run all requests concurrently; `on_result` is called serially as each finishes."""
        if not requests:
            return []
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._run_all(requests, on_result))
        # Called from inside an event loop (e.g. a web server): run ours on a worker thread.
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["out"] = asyncio.run(self._run_all(requests, on_result))
            except BaseException as e:  # re-raised on the caller's thread below
                box["err"] = e

        thread = threading.Thread(target=work, name="hippo-gpu-llm")
        thread.start()
        thread.join()
        if "err" in box:
            raise box["err"]
        return box["out"]

    async def _run_all(
        self, requests: Sequence[ChatRequest], on_result: OnResult | None
    ) -> list[Completion]:
        import openai

        client = openai.AsyncOpenAI(
            base_url=self.base_url, api_key=self.api_key, timeout=self.timeout, max_retries=0
        )
        gate = asyncio.Semaphore(self.concurrency)
        results: list[Completion | None] = [None] * len(requests)

        async def one(i: int, request: ChatRequest) -> None:
            async with gate:
                completion = await self._with_retries(client, request)
            results[i] = completion
            if on_result is not None:
                on_result(i, completion)

        try:
            await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
        finally:
            await client.close()
        return [r if r is not None else Completion(None, "not_run") for r in results]

    async def _with_retries(self, client: Any, request: ChatRequest) -> Completion:
        import openai

        attempt = 0
        while True:
            mode = self._schema_mode
            try:
                return await self._call(client, request, mode)
            except openai.BadRequestError as e:
                if request.json_schema is not None and mode != "none" and _mentions_format(e):
                    self._downgrade(mode)
                    continue
                return Completion(None, "http_400")
            except (openai.APITimeoutError, openai.APIConnectionError) as e:
                reason = "timeout" if isinstance(e, openai.APITimeoutError) else "connection"
            except openai.APIStatusError as e:
                status = e.status_code
                if status < 500 and status not in _RETRY_STATUS:
                    return Completion(None, f"http_{status}")
                reason = f"http_{status}"
            except openai.APIResponseValidationError:
                reason = "bad_response"
            if attempt >= self.max_retries:
                return Completion(None, reason)
            delay = min(self.max_backoff, self.backoff * 2**attempt)
            await asyncio.sleep(delay * self._rng.uniform(0.5, 1.0))
            attempt += 1

    async def _call(self, client: Any, request: ChatRequest, mode: str) -> Completion:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": list(request.messages),
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
        }
        if request.json_schema is not None and mode == "json_schema":
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": request.schema_name, "schema": request.json_schema},
            }
        elif request.json_schema is not None and mode == "json_object":
            kwargs["response_format"] = {"type": "json_object"}
        response = await client.chat.completions.create(**kwargs)
        choices = getattr(response, "choices", None)
        if not choices:
            return Completion(None, "empty_response")
        choice = choices[0]
        text = choice.message.content if choice.message is not None else None
        usage = getattr(response, "usage", None)
        return Completion(
            text=text,
            error=None if text is not None else "empty_response",
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            finish_reason=choice.finish_reason,
        )

    def _downgrade(self, mode: str) -> None:
        if self._schema_mode == mode:  # another request may have downgraded already
            self._schema_mode = _SCHEMA_MODES[_SCHEMA_MODES.index(mode) + 1]


def _mentions_format(error: Exception) -> bool:
    text = str(error).lower()
    return "response_format" in text or "json_schema" in text or "schema" in text
