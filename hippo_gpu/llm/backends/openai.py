"""OpenAI-compatible HTTP backend: async, bounded concurrency, timeouts, the SDK's retries.

Works against OpenAI, vLLM's server, llama.cpp's server, SGLang, TGI and the like. The `openai`
package is imported lazily, on first use.

Retry policy: the openai SDK's own (`AsyncOpenAI(max_retries=...)`): timeouts, connection errors,
HTTP 408/409/429 and 5xx are retried up to `max_retries` times (a server's `x-should-retry`
header overrides the status rule). Between tries the SDK sleeps what the server asks for in
`Retry-After` / `retry-after-ms`, within the SDK's cap (two minutes in the openai 3.x installed
here, which does not retry at all past it; 60 s in 1.x), else an exponential backoff with
jitter: the SDK's (0.5 s doubling to 8 s, minus up to 25%), or, when `backoff` is given,
`min(max_backoff, backoff * 2**attempt) * U(0.5, 1)`. Other HTTP errors fail the request at
once. A request that still fails becomes a `Completion` with an error reason (timeout,
connection, http_<status>, bad_response), never an exception. A server that rejects
`response_format` (HTTP 400 naming it) is asked again with a weaker mode (json_schema ->
json_object -> none) and that mode is kept for later calls.
At most `concurrency` requests (each with its retries and sleeps) are in flight at once.
"""

from __future__ import annotations

import asyncio
import importlib.util
import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

from hippo_gpu.llm.backends.base import (
    Backend,
    BackendUnavailable,
    ChatRequest,
    Completion,
    OnResult,
)

_SCHEMA_MODES = ("json_schema", "json_object", "none")


class OpenAIBackend(Backend):
    """Chat completions over HTTP with the async `openai` client.

    Args:
        model: model name sent to the server.
        base_url: e.g. "http://127.0.0.1:8000/v1".
        api_key: bearer token; local servers accept any value.
        concurrency: requests in flight at once.
        timeout: seconds per HTTP attempt.
        max_retries: extra attempts for retryable failures (the SDK's `max_retries`).
        backoff: base of the exponential backoff between tries, seconds; None keeps the SDK's
            schedule. A usable Retry-After from the server wins either way.
        max_backoff: cap on one backoff sleep, seconds (with `backoff`; default 8, the SDK's).
        use_schema: send `response_format` when a request carries a JSON schema.
        seed: random seed of the jitter of `backoff` (tests).
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
        backoff: float | None = None,
        max_backoff: float = 8.0,
        use_schema: bool = True,
        seed: int | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if backoff is not None and not 0 <= backoff <= max_backoff:
            raise ValueError(f"need 0 <= backoff <= max_backoff, got {backoff}, {max_backoff}")
        if importlib.util.find_spec("openai") is None:  # imported on first use: say it now
            raise BackendUnavailable("the openai: backend needs the openai package (the [llm] "
                                     "extra): pip install \"hippo-gpu[llm]\"")
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
        client = _make_client(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout,
                              max_retries=self.max_retries,
                              backoff=self._backoff if self.backoff is not None else None)
        gate = asyncio.Semaphore(self.concurrency)
        results: list[Completion | None] = [None] * len(requests)

        async def one(i: int, request: ChatRequest) -> None:
            async with gate:
                completion = await self._request(client, request)
            results[i] = completion
            if on_result is not None:
                on_result(i, completion)

        try:
            await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
        finally:
            await client.close()
        return [r if r is not None else Completion(None, "not_run") for r in results]

    async def _request(self, client: Any, request: ChatRequest) -> Completion:
        """One request, retried by the SDK; a format rejection retries with a weaker mode."""
        import openai

        while True:
            mode = self._schema_mode
            try:
                return await self._call(client, request, mode)
            except openai.BadRequestError as e:
                if request.json_schema is not None and mode != "none" and _mentions_format(e):
                    self._downgrade(mode)  # at most twice: json_schema -> json_object -> none
                    continue
                return Completion(None, "http_400")
            except openai.APITimeoutError:  # a subclass of APIConnectionError: test it first
                return Completion(None, "timeout")
            except openai.APIConnectionError:
                return Completion(None, "connection")
            except openai.APIStatusError as e:
                return Completion(None, f"http_{e.status_code}")
            except openai.APIResponseValidationError:
                return Completion(None, "bad_response")
            except AttributeError as e:
                # httpcore's anyio backend reads the peer address of a socket that the dying
                # server already closed ('NoneType' object has no attribute 'getpeername'):
                # the connection failed while being opened, so it is one. Anything else is ours.
                if "getpeername" not in str(e):
                    raise
                return Completion(None, "connection")

    def _backoff(self, attempt: int) -> float:
        """Seconds before retry `attempt` (0-based) when the server gave no Retry-After."""
        assert self.backoff is not None  # only handed to the client when backoff is set
        delay = min(self.max_backoff, self.backoff * 2**attempt)
        return delay * self._rng.uniform(0.5, 1.0)

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


def _make_client(*, base_url: str, api_key: str, timeout: float, max_retries: int,
                 backoff: Callable[[int], float] | None) -> Any:
    """`openai.AsyncOpenAI` with the SDK's retries; with `backoff`, our sleep between tries.

    The SDK exposes no setting for its backoff, so a custom one overrides the client's
    `_calculate_retry_timeout` hook (present since openai 1.0) for responses without a
    Retry-After header; with one, the SDK's own reading of it stands.
    """
    import openai

    if backoff is None:
        return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout,
                                  max_retries=max_retries)
    delay: Callable[[int], float] = backoff  # narrowed for the class body below

    class Client(openai.AsyncOpenAI):
        def _calculate_retry_timeout(self, remaining_retries: int, options: Any,
                                     response_headers: Any = None) -> float:
            if response_headers is not None and (
                    "retry-after" in response_headers or "retry-after-ms" in response_headers):
                return float(super()._calculate_retry_timeout(remaining_retries, options,
                                                              response_headers))
            return delay(options.get_max_retries(self.max_retries) - remaining_retries)

    return Client(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries)


def _mentions_format(error: Exception) -> bool:
    text = str(error).lower()
    return "response_format" in text or "json_schema" in text or "schema" in text
