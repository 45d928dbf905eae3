"""Texts -> L2-normalised embedding rows (the names below are the package's public API).

    encoder.py       Encoder (an EncoderConfig's model, torch or ONNX), EmbeddingCache
    onnx_backend.py  export to ONNX, the ONNX Runtime encoder, its parity check against torch
    openai_client.py OpenAIEmbeddings: an OpenAI-compatible embeddings server ("openai:" models)
    sources.py       weightless sources: HashEncoder, PrecomputedEmbeddings, EmbeddingFunction
    rows.py          the L2 normaliser and length buckets the others share

Module constants (ONNX_PARITY_ATOL, ...) are read from their own module: patch them there.
"""

from hippo_gpu.embed.encoder import (
    EmbeddingCache,
    Encoder,
    resolve_model_path,
    runnable_precision,
    text_digest,
)
from hippo_gpu.embed.onnx_backend import (
    ONNX_FORMAT,
    ONNX_OPSET,
    ONNX_PARITY_ATOL,
    PARITY_TEXTS,
    OnnxEncoder,
    OnnxExportError,
    default_onnx_dir,
    export_onnx,
    load_onnx_encoder,
    onnx_cache_key,
)
from hippo_gpu.embed.openai_client import (
    EmbeddingDimensionError,
    EmbeddingResponseError,
    EmbeddingServerError,
    OpenAIEmbeddings,
    RemoteStats,
    estimate_tokens,
)
from hippo_gpu.embed.rows import length_buckets
from hippo_gpu.embed.sources import (
    HASH_PREFIX,
    EmbeddingFunction,
    HashEncoder,
    PrecomputedEmbeddings,
    hash_encoder_dim,
    save_precomputed,
)

__all__ = [
    "HASH_PREFIX", "ONNX_FORMAT", "ONNX_OPSET", "ONNX_PARITY_ATOL", "PARITY_TEXTS",
    "EmbeddingCache", "EmbeddingDimensionError", "EmbeddingFunction", "EmbeddingResponseError",
    "EmbeddingServerError", "Encoder", "HashEncoder", "OnnxEncoder", "OnnxExportError",
    "OpenAIEmbeddings", "PrecomputedEmbeddings", "RemoteStats", "default_onnx_dir",
    "estimate_tokens", "export_onnx", "hash_encoder_dim", "length_buckets",
    "load_onnx_encoder", "onnx_cache_key", "resolve_model_path", "runnable_precision",
    "save_precomputed", "text_digest",
]
