"""Embedding sources that need no neural network: the hash encoder and precomputed vectors.

`HashEncoder` ("hash:D" model names) is the weightless deterministic encoder for synthetic
corpora and tests; `PrecomputedEmbeddings` reads vectors computed elsewhere (written with
`save_precomputed`); `EmbeddingFunction` is the type of an embedding function a caller supplies
to build_index instead.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from hippo_gpu.embed.rows import l2_normalize

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
            out[found] = l2_normalize(np.asarray(vectors[at[found]], dtype=np.float32))
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
