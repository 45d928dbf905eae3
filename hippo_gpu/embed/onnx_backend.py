"""The ONNX backend: export a sentence-transformers model once, run it with ONNX Runtime.

The same module stack (transformer -> pooling -> normalise, as the model's modules.json lists
it) is exported with torch.onnx, cached on disk under a key of everything the export depends on
(`onnx_cache_key`), and run on the CPU in float32 with the model's own tokenisation, in length
buckets (`OnnxEncoder`). `load_onnx_encoder` publishes an export only after it passed the parity
check against torch: max |e_onnx - e_torch| < ONNX_PARITY_ATOL on PARITY_TEXTS. ONNX Runtime
runs one pre-planned graph (attention, GELU and layer norms fused for BERT-type models).

Batches are length-bucketed: the texts of one call are sorted by token count, cut into batches
of at most `batch_size`, each batch is trimmed to its own longest text, and rows go back to the
caller's order. What made a call with 32 queries dearer per query than one with 8 is padding:
one batch pads every query to the longest of the 32 (45 tokens for a median of 20 on
musique_train), and costs 1.4x more CPU per query than buckets of 16 (bench_encoder.py, `onnx
1-pad` rows).
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
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hippo_gpu.config import cache_root
from hippo_gpu.embed.rows import l2_normalize, length_buckets
from hippo_gpu.errors import HippoGpuError
from hippo_gpu.storage.durable import write_atomic

logger = logging.getLogger(__name__)

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


class OnnxExportError(HippoGpuError, RuntimeError):
    """The model could not be exported to ONNX or loaded by ONNX Runtime."""


def default_onnx_dir() -> Path:
    """Where exported encoders live: cache_root()/onnx ($HIPPO_GPU_CACHE/onnx, else
    ~/.cache/hippo_gpu/onnx)."""
    return cache_root() / "onnx"


def embedding_dim(model: Any) -> int:
    """D of a SentenceTransformer (the getter was renamed in sentence-transformers 6)."""
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
            logger.info("keeping the default attention for the ONNX export: %s", e)
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
            logger.info("ONNX Runtime BERT fusion failed (%s); using the unfused export", e)
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
        self.dim = embedding_dim(model)
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
        diffs = [np.abs(l2_normalize(enc(PARITY_TEXTS, b)) - ref).max()
                 for b in (len(PARITY_TEXTS), 1)]
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
            write_atomic(failed, str(e))
            raise
        seconds = time.perf_counter() - start
        err = parity(enc)
        if err >= ONNX_PARITY_ATOL:
            msg = f"export differs from torch by {err:.2e} >= {ONNX_PARITY_ATOL:.0e}"
            write_atomic(failed, msg)
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
