"""vLLM offline engine backend: batched generation with guided JSON decoding (CUDA only).

`vllm` is imported when the backend is built, never at package import; it is the `[vllm]` extra.
A whole batch goes to `LLM.chat` at once so vLLM's continuous batching fills the GPU. Requests
that carry a JSON schema get guided decoding: `StructuredOutputsParams(json=...)` on recent vLLM,
`GuidedDecodingParams(json=...)` on older releases, none when neither exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hippo_gpu.llm.backends.base import (
    Backend,
    BackendUnavailable,
    ChatRequest,
    Completion,
    OnResult,
)


def _guided(schema: dict[str, Any]) -> dict[str, Any]:
    """SamplingParams keyword arguments that constrain output to `schema` on this vLLM."""
    try:
        from vllm.sampling_params import StructuredOutputsParams

        return {"structured_outputs": StructuredOutputsParams(json=schema)}
    except ImportError:
        pass
    try:
        from vllm.sampling_params import GuidedDecodingParams

        return {"guided_decoding": GuidedDecodingParams(json=schema)}
    except ImportError:
        return {}


class VLLMBackend(Backend):
    """Chat generation with `vllm.LLM` on the local GPU.

    Args:
        model: Hugging Face id or local path of an instruction model.
        max_model_len: context length to reserve KV cache for.
        gpu_memory_utilization: fraction of GPU memory vLLM may take.
        use_schema: guided JSON decoding for requests with a schema.
        **engine_options: forwarded to `vllm.LLM` (dtype, tensor_parallel_size, ...).
    """

    def __init__(
        self,
        model: str,
        *,
        max_model_len: int = 4096,
        gpu_memory_utilization: float = 0.8,
        use_schema: bool = True,
        **engine_options: Any,
    ) -> None:
        import torch

        if not torch.cuda.is_available():
            raise BackendUnavailable("the vllm backend needs a CUDA GPU")
        try:
            import vllm
        except ImportError as e:
            raise BackendUnavailable("the vllm backend needs vllm: pip install 'hippo-gpu[vllm]'") \
                from e
        self.model = f"vllm:{model}"
        self.use_schema = use_schema
        self._vllm = vllm
        self._llm: Any = vllm.LLM(model=model, max_model_len=max_model_len,
                                  gpu_memory_utilization=gpu_memory_utilization, **engine_options)
        self.guided_available = bool(_guided({"type": "object"}))

    def generate(
        self, requests: Sequence[ChatRequest], on_result: OnResult | None = None
    ) -> list[Completion]:
        """One `LLM.chat` call for the whole batch; results in request order."""
        if not requests:
            return []
        params = []
        for r in requests:
            extra = _guided(r.json_schema) if (self.use_schema and r.json_schema) else {}
            params.append(self._vllm.SamplingParams(
                temperature=r.temperature, max_tokens=r.max_tokens, **extra))
        outputs = self._llm.chat([list(r.messages) for r in requests], sampling_params=params,
                                 use_tqdm=False)
        results = []
        for i, out in enumerate(outputs):
            gen = out.outputs[0] if out.outputs else None
            if gen is None:
                completion = Completion(None, "empty_response")
            else:
                completion = Completion(
                    text=gen.text,
                    prompt_tokens=len(out.prompt_token_ids or []),
                    completion_tokens=len(gen.token_ids or []),
                    finish_reason=gen.finish_reason,
                )
            results.append(completion)
            if on_result is not None:
                on_result(i, completion)
        return results

    def close(self) -> None:
        self._llm = None
