"""hippo_gpu.indexing.index: an Index is the data of one saved version, loaded as saved and moved
between precisions without touching its tables."""

from __future__ import annotations

import pytest
import torch

from hippo_gpu import load_index
from hippo_gpu.storage.directory import IndexFormatError


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


def test_key_rows_follow_splices_like_a_fresh_dict():
    """KeyRows.spliced (a commit's renumbering: removed rows out, the rest shifted down, added
    keys appended) answers as the dict {key: row} of the new key list built afresh."""
    import random

    import numpy as np

    from hippo_gpu.tables import KeyRows

    rng = random.Random(7)
    keys = [f"chunk-{rng.getrandbits(128):032x}" for _ in range(300)]
    rows = KeyRows.of(keys)
    for _ in range(20):
        removed = np.array(sorted(rng.sample(range(len(keys)), rng.randint(0, 10))), np.int64)
        added = [f"chunk-{rng.getrandbits(128):032x}" for _ in range(rng.randint(0, 6))]
        if rng.random() < 0.2:
            added.append(f"k{rng.getrandbits(16)}")  # a shorter key widens nothing
        gone = set(removed.tolist())
        kept = [k for i, k in enumerate(keys) if i not in gone]
        rows = rows.spliced(removed, added, len(kept))
        old, keys = keys, kept + added
        want = {k: i for i, k in enumerate(keys)}
        assert len(rows) == len(want)
        assert all(rows[k] == i for k, i in want.items())
        assert all(k not in rows for i, k in enumerate(old) if i in gone)
    assert rows.get("chunk-" + "0" * 40) is None and "x\0" not in rows
    with pytest.raises(KeyError):
        rows["nope"]
