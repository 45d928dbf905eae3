"""The write plan's sorted merge of a name table (versions/delta.py, `_merge_sorted`) against a
plain-Python reference: the alive old names and the wanted ones, sorted; each old row's new row
(-1 when dropped); the new rows of the names the old table lacked; the same result whether the
old names come as a StringTable (an index loaded from disk) or a plain list (one built in
memory)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from hippo_gpu.tables import StringTable
from hippo_gpu.versions.delta import _merge_sorted


def _reference(old: list[str], alive: list[bool], wanted: set[str]):
    kept = {s for s, a in zip(old, alive, strict=True) if a} | (wanted & set(old))
    table = sorted(kept | wanted)
    row = {s: i for i, s in enumerate(table)}
    old_to_new = [row[s] if s in kept else -1 for s in old]
    fresh = sorted(row[s] for s in wanted - set(old))
    return table, old_to_new, fresh, [s in kept for s in old]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("as_table", [True, False], ids=["table", "list"])
def test_merge_sorted_equals_the_reference(seed: int, as_table: bool) -> None:
    rng = random.Random(seed)
    words = [f"{rng.choice('abcdef')}{rng.randrange(40):02d}" for _ in range(60)]
    old = sorted(set(words[:30]))
    alive = [rng.random() < 0.7 for _ in old]
    wanted = set(rng.sample(words, 12)) | ({old[0], old[-1]} if seed % 2 else {"zz", "00"})
    given = np.array(alive)
    table, old_to_new, new_rows, alive_after = _merge_sorted(
        StringTable.from_strings(old) if as_table else list(old), given, wanted)
    want = _reference(old, alive, wanted)
    assert isinstance(table, StringTable)
    assert list(table) == want[0]
    assert old_to_new.tolist() == want[1] and old_to_new.dtype == np.int64
    assert new_rows.tolist() == want[2] and new_rows.dtype == np.int64
    assert alive_after.tolist() == want[3]
    assert given.tolist() == alive  # the caller's array is not changed


def test_merge_sorted_of_nothing() -> None:
    table, old_to_new, new_rows, alive = _merge_sorted([], np.zeros(0, bool), set())
    assert list(table) == [] and old_to_new.tolist() == [] and new_rows.tolist() == []
    table, old_to_new, new_rows, alive = _merge_sorted(["b"], np.array([False]), {"a", "c"})
    assert list(table) == ["a", "c"] and old_to_new.tolist() == [-1]
    assert new_rows.tolist() == [0, 1] and alive.tolist() == [False]
