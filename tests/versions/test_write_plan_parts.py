"""Parts of the write plan (versions/delta.py) against plain-Python references.

`_merge_sorted`: the alive old names and the wanted ones, sorted; each old row's new row (-1
when dropped); the new rows of the names the old table lacked; the same result whether the old
names come as a StringTable (an index loaded from disk) or a plain list (one built in memory).
`lex_search`: the left insertion positions of rank triples among sorted ones, equal to Python's
bisect on tuples, through the packed int64 keys and through the column-wise fallback that
`_rank_keys` chooses when a key could overflow int64."""

from __future__ import annotations

import bisect
import random

import numpy as np
import pytest

from hippo_gpu.tables import StringTable
from hippo_gpu.versions.delta import _merge_sorted, _rank_keys, lex_search


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


@pytest.mark.parametrize(("m", "r"), [(1, 1), (7, 3), (2**20, 2**10), (2**31, 4), (2**40, 2**5),
                                    (2**40, 1)],
                         ids=["one", "small", "keys", "overflow", "huge", "huge-one-predicate"])
def test_lex_search_equals_bisect_on_tuples(m: int, r: int) -> None:
    rng = random.Random(m + r)

    def triples(n: int) -> list[tuple[int, int, int]]:
        picks = [0, 1, m - 1] if m > 2 else list(range(m))
        return [(rng.choice(picks + [rng.randrange(m)]), rng.randrange(r),
                 rng.choice(picks + [rng.randrange(m)])) for _ in range(n)]

    table = sorted(set(triples(200)))
    queries = triples(100) + table[:5] + [table[-1]]
    got = lex_search(np.array(table, dtype=np.int64), np.array(queries, dtype=np.int64), m, r)
    assert got.tolist() == [bisect.bisect_left(table, q) for q in queries]
    assert got.dtype == np.int64  # row positions, usable as indices
    # packed keys exactly while (m · r) · m stays below 2^62 (no key can overflow int64)
    keys = _rank_keys(np.array(table, dtype=np.int64), m, r)
    assert (keys is None) == (m * r * m >= 2**62)
    if keys is not None:
        assert keys.tolist() == sorted(keys.tolist()) and len(set(keys.tolist())) == len(table)
