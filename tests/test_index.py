"""hippo_gpu.index: an Index is the data of one saved version, loaded as saved and moved between
precisions without touching its tables."""

from __future__ import annotations

import pytest
import torch

from hippo_gpu import load_index
from hippo_gpu.store import IndexFormatError


def test_load_equals_the_built_index_and_precision_moves_only_the_vectors(sample_index_dir,
                                                                          sample_index) -> None:
    again = load_index(sample_index_dir, device="cpu")
    assert again.stats() == sample_index.stats()
    assert list(again.passage_keys) == list(sample_index.passage_keys)
    assert torch.equal(again.passage_emb, sample_index.passage_emb)
    half = again.to("cpu", "bfloat16")
    assert half.precision == "bfloat16" and half.passage_emb.dtype == torch.bfloat16
    assert list(half.passage_keys) == list(again.passage_keys)
    assert torch.equal(half.adjacency.values(), again.adjacency.values())
    back = half.to("cpu", "float32")
    assert back.passage_emb.dtype == torch.float32


def test_an_encoder_mismatch_is_refused_naming_both(sample_index_dir) -> None:
    with pytest.raises(IndexFormatError, match="hash:32"):
        load_index(sample_index_dir, device="cpu", encoder="hash:32")
