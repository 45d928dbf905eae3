"""LLM backends, one file per engine, behind the interface in `base`; `make_backend` builds one.

Spec strings:
    openai:MODEL@http://host:port/v1   OpenAIBackend (openai.py: any OpenAI-compatible server)
    vllm:MODEL                         VLLMBackend (vllm.py: offline engine, CUDA only)
    local:smollm2                      LocalBackend (llamacpp.py: bundled SmolLM2-135M, 1 thread)

Engine modules import their client packages lazily, so importing this package needs none of them.
"""

from __future__ import annotations

from typing import Any

from hippo_gpu.llm.backends.base import (
    Backend,
    BackendError,
    BackendSpec,
    BackendSpecError,
    BackendUnavailable,
    ChatRequest,
    Completion,
    OnResult,
    canonical_json,
    parse_spec,
)

__all__ = [
    "Backend",
    "BackendError",
    "BackendSpec",
    "BackendSpecError",
    "BackendUnavailable",
    "ChatRequest",
    "Completion",
    "OnResult",
    "canonical_json",
    "make_backend",
    "parse_spec",
]


def make_backend(spec: str | Backend, **options: Any) -> Backend:
    """Build a backend from a spec string (a `Backend` passes through unchanged).

    Args:
        spec: see the module docstring.
        **options: forwarded to the backend's constructor (e.g. `concurrency`, `timeout`).
    """
    if isinstance(spec, Backend):
        return spec
    parsed = parse_spec(spec)
    if parsed.kind == "openai":
        from hippo_gpu.llm.backends.openai import OpenAIBackend

        return OpenAIBackend(parsed.model, parsed.base_url or "", **options)
    if parsed.kind == "vllm":
        from hippo_gpu.llm.backends.vllm import VLLMBackend

        return VLLMBackend(parsed.model, **options)
    from hippo_gpu.llm.backends.llamacpp import LocalBackend

    return LocalBackend(parsed.model, **options)
