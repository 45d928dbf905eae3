"""The backend interface: a batch of chat requests -> a batch of completions, and its errors.

A backend never raises for one bad request: each `Completion` carries either `text` or `error`
(a short reason such as "http_500" or "timeout"), so one failure cannot sink a batch and every
failure can be counted and cached as failed. Backends are built from a spec string:

    openai:MODEL@http://host:port/v1   OpenAIBackend (any OpenAI-compatible server)
    vllm:MODEL                         VLLMBackend (offline engine, CUDA only)
    local:smollm2                      LocalBackend (bundled SmolLM2-135M on llama.cpp, 1 thread)
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hippo_gpu.errors import HippoGpuError

Message = dict[str, str]


class BackendError(HippoGpuError, RuntimeError):
    """An LLM backend could not be used at all (as opposed to one request failing)."""


class BackendSpecError(HippoGpuError, ValueError):
    """A backend spec string could not be parsed."""


class BackendUnavailable(BackendError):
    """The backend's package, model file or device is missing on this machine."""


@dataclass(frozen=True)
class ChatRequest:
    """One chat completion request.

    Attributes:
        messages: OpenAI-style messages (role, content).
        max_tokens: cap on generated tokens.
        temperature: sampling temperature (0 = greedy, as HippoRAG uses).
        json_schema: when set, the backend asks the server to constrain output to this schema
            (OpenAI `response_format` json_schema, vLLM guided decoding), where supported.
        schema_name: a name for the schema (OpenAI requires one).
    """

    messages: tuple[Message, ...]
    max_tokens: int = 512
    temperature: float = 0.0
    json_schema: dict[str, Any] | None = field(default=None, compare=False)
    schema_name: str = "output"

    def params(self) -> dict[str, Any]:
        """Generation parameters that change the output: part of every cache key."""
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "schema": self.json_schema,
        }


@dataclass(frozen=True)
class Completion:
    """The result of one request: `text` on success, else `error` (a short reason)."""

    text: str | None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.text is not None


OnResult = Callable[[int, Completion], None]


class Backend(abc.ABC):
    """Batch of chat requests -> batch of completions, in request order."""

    #: model identifier; part of every cache key
    model: str

    @abc.abstractmethod
    def generate(
        self, requests: Sequence[ChatRequest], on_result: OnResult | None = None
    ) -> list[Completion]:
        """Run all requests; call `on_result(i, completion)` as each one finishes.

        `on_result` lets callers commit results as they arrive (crash safety) instead of after
        the whole batch. It runs on the caller's thread.
        """

    def close(self) -> None:
        """Release servers, engines and connections. Idempotent; the default holds none."""
        return None

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class BackendSpec:
    """A parsed spec string: `kind` in {"openai", "vllm", "local"}, `model`, optional `base_url`."""

    kind: str
    model: str
    base_url: str | None = None


def parse_spec(spec: str) -> BackendSpec:
    """Parse `openai:MODEL@URL`, `vllm:MODEL` or `local:NAME`.

    Raises:
        BackendSpecError: on an unknown kind or a missing model/URL.
    """
    kind, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise BackendSpecError(
            f"bad LLM spec {spec!r}; use openai:MODEL@http://host:port/v1, vllm:MODEL "
            "or local:smollm2"
        )
    if kind == "openai":
        # The model name may itself contain '@' (rare); the URL is after the last one.
        model, at, url = rest.rpartition("@")
        if not at or not model or not url.startswith(("http://", "https://")):
            raise BackendSpecError(
                f"bad OpenAI spec {spec!r}; expected openai:MODEL@http://host:port/v1"
            )
        return BackendSpec("openai", model, url.rstrip("/"))
    if kind in ("vllm", "local"):
        return BackendSpec(kind, rest)
    raise BackendSpecError(f"unknown LLM backend {kind!r} in {spec!r}; use openai, vllm or local")


def canonical_json(value: Any) -> str:
    """Stable JSON text for hashing (sorted keys, no whitespace, UTF-8 kept)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
