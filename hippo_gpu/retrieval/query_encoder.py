"""The query side of an index's encoder: loaded on first use, shared by whatever ranks queries.

A Searcher and the EntityRanker it owns both encode texts (queries; entity names) with the
index's own model. They share one `QueryEncoder`, which loads the model once, checks its
dimension against the index, and probes once whether its tokenizer lower-cases its input. A
searcher over another version of the same index (`Searcher.over`) shares it too, so a commit
does not reload the model. The object holds no reference to the Searcher or the index, so a
version's searcher is freed as soon as nothing else holds it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from hippo_gpu.config import EncoderConfig
from hippo_gpu.embed import Encoder
from hippo_gpu.storage.directory import IndexFormatError

__all__ = ["QueryEncoder"]

_CASE_PROBE = "Marta Quill Of HARROWGATE"


class QueryEncoder:
    """An index's encoder for queries, loaded on first use.

    Args:
        config: the encoder settings for queries (the index's model; query precision, batch
            size, backend and server URL as the Searcher resolved them).
        device: where the vectors are computed.
        dim: the index's embedding dimension; a model giving another one is an
            `IndexFormatError`.
        cache_dir: embedding cache for the encoder.
        loaded: an already loaded encoder of the same model to reuse.
    """

    def __init__(self, config: EncoderConfig, device: torch.device, dim: int, *,
                 cache_dir: str | Path | None = None, loaded: Encoder | None = None) -> None:
        self.config = config
        self.device = device
        self.dim = dim
        self.cache_dir = cache_dir
        self._encoder = loaded
        self._uncased: bool | None = None

    @property
    def encoder(self) -> Encoder:
        """The encoder, loaded on first use."""
        if self._encoder is None:
            # a server encoder checks every answer against the index's dimension
            enc = Encoder(self.config, self.device, cache_dir=self.cache_dir,
                          dim=self.dim if self.config.is_remote else None)
            if enc.dim != self.dim:
                raise IndexFormatError(f"encoder {self.config.model!r} gives dim {enc.dim}, "
                                       f"the index holds dim {self.dim}")
            self._encoder = enc
        return self._encoder

    @property
    def loaded(self) -> Encoder | None:
        """The encoder if it is loaded, else None (reading it loads nothing)."""
        return self._encoder

    def encode(self, texts: list[str]) -> Tensor:
        """[len(texts), dim] L2-normalised vectors of plain texts (no query instruction)."""
        return self.encoder.encode(texts)

    @property
    def uncased(self) -> bool:
        """Whether the tokenizer lower-cases its input (checked on a probe), so that a text and
        its lower-cased form get the same vector. False when unknown."""
        if self._uncased is None:
            enc = self.encoder
            try:
                ids = enc.token_ids(_CASE_PROBE)
                self._uncased = ids is not None and ids == enc.token_ids(_CASE_PROBE.lower())
            except (TypeError, KeyError):
                self._uncased = False
        return self._uncased

    @uncased.setter
    def uncased(self, value: bool) -> None:
        self._uncased = value
