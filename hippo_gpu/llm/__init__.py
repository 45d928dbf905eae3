"""LLM layer: OpenIE extraction, recognition-memory filter, query NER and QA reading.

Nothing here imports an LLM client at import time: `openai`, `xllamacpp` and `vllm` are imported
inside the backend that needs them, so `hippo_gpu.retrieval.searcher` and `hippo_gpu.ppr` stay
client-free.

Backends are named by a spec string (see `make_backend`):
    openai:MODEL@http://host:port/v1   any OpenAI-compatible server
    vllm:MODEL                         vLLM offline engine (CUDA only)
    local:smollm2                      SmolLM2-135M-Instruct on llama.cpp, CPU, 1 thread
"""

from hippo_gpu.llm.backends import (
    Backend,
    BackendError,
    BackendSpecError,
    BackendUnavailable,
    ChatRequest,
    Completion,
    make_backend,
)
from hippo_gpu.llm.cache import LLMCache
from hippo_gpu.llm.extract import ExtractReport, extract_openie
from hippo_gpu.llm.filter import FilterOutcome, RecognitionMemoryFilter
from hippo_gpu.llm.ner import QueryNER, read_query_ner_tsv
from hippo_gpu.llm.parse import OutputRejected, ParseStats
from hippo_gpu.llm.qa import QAReader

__all__ = [
    "Backend",
    "BackendError",
    "BackendSpecError",
    "BackendUnavailable",
    "ChatRequest",
    "Completion",
    "ExtractReport",
    "FilterOutcome",
    "LLMCache",
    "OutputRejected",
    "ParseStats",
    "QAReader",
    "QueryNER",
    "RecognitionMemoryFilter",
    "extract_openie",
    "make_backend",
    "read_query_ner_tsv",
]
