"""A chain of segments replayed as one change of its base: O(N + change) instead of O(k · N).

A segment's replay (`replay`) is delta.plan_change and delta.apply_change of its change, which
costs array work over every row of the index (the canonical layout is re-derived). A chain of
k segments replayed one by one pays that k times. But the chain's net effect is itself one
change of the base: remove the base passages it removed, append the passages it added that are
still there, in the order they were added. `replay_chain` plans and applies that one change and
gives it what the k replays would have given each text, so the result equals the sequential
replay bit for bit:

  Tables. plan_change lays out the canonical tables of the final corpus, which are the same
    whatever path led to it (versions/delta.py's claim): the kept base passages in order, then the
    surviving added ones in order of addition, with their stored triples.
  Vectors. In the sequential replay a text's vector is the one stored by the last segment in
    which the text was new (used by no passage of the version before it: plan_change asks for a
    vector exactly then), and the base's if it never was. So the chain is walked once keeping
    occurrence counts of every phrase and fact over the alive passages; a segment's new texts
    are its added texts with count 0 before it, in the order its vectors are stored (phrases by
    string, facts by (subject, predicate, object) string triple: the order of delta.Plan's new
    rows). Texts the base lacks take the latest stored vector; base texts that died and came
    back have their copied base row replaced by it.
  Synonyms. A phrase's list in the sequential replay is the one of the last segment that
    recomputed it (its source among that segment's affected rows); a phrase never recomputed
    keeps the base's list. A phrase that dies loses its list, and if it comes back it is new in
    that segment, which recomputes it (update_synonym_rows recomputes every added phrase): so
    a surviving phrase's list is its last recomputation's. Each segment's affected rows and
    edges are read in that version's rows, named by string (the version's phrase table is the
    alive base rows merged with the alive added strings, so a row is found by two searchsorted
    calls); the composed update holds, in segment order, each segment's edges whose (surviving)
    source it recomputed last, and its affected set is every surviving recomputed phrase, so
    kept_synonyms keeps exactly the base lists the sequential replay kept. The concatenation
    order ([kept base edges, then each segment's kept edges]) is the sequential one too, since
    kept_synonyms keeps the order of the edges it keeps.
  Report. The triple counts are sums, so they agree; the "recomputed_phrases" figure is the
    last segment's, as the sequential replay leaves it.

Every segment is still checked against the version before it (removed rows in range, as many
stored vectors as new texts, the recorded counts), so a chain that does not fit is refused as
before. Cost per segment: its change (the counts, O(change · log M) lookups) and, for its
synonym rows, one pass over the base's phrase counts (numpy, O(M)); then one plan and apply of
the net change. `tests/versions/test_chain.py` checks the result against the sequential replay.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np
import torch

from hippo_gpu.data import Passage, Triple
from hippo_gpu.indexing.index import Index
from hippo_gpu.indexing.synonyms import SynonymEdges
from hippo_gpu.storage.directory import IndexFormatError
from hippo_gpu.tables import sorted_position
from hippo_gpu.versions.delta import (
    Change,
    NewVectors,
    SynonymUpdate,
    apply_change,
    lex_search,
    node_to_new,
    plan_change,
)
from hippo_gpu.versions.placed_rows import PendingRows

__all__ = ["Segment", "expected_counts", "replay", "replay_chain", "replay_mapped"]

K = TypeVar("K", str, Triple)  # a phrase, or a fact as its (subject, predicate, object)


@dataclass
class Segment:
    """One commit's change and its stored results (versions/load.py's docstring)."""

    change: Change
    vectors: NewVectors
    synonyms: SynonymUpdate
    expect: dict[str, int]  # counts of the version it produces: phrases, facts, passages


def expected_counts(index: Index) -> dict[str, int]:
    return {"phrases": len(index.phrases), "facts": len(index.facts),
            "passages": len(index.passage_keys)}


def replay(index: Index, segment: Segment, *, path: Path, version: int,
           pending: bool = False) -> Index:
    """The version one segment produces from the one before it; with `pending` its embeddings
    stay placed_rows.PendingRows (the caller settles the last one)."""
    return replay_mapped(index, segment, path=path, version=version, pending=pending)[0]


def replay_mapped(index: Index, segment: Segment, *, path: Path, version: int,
                  pending: bool = False) -> tuple[Index, np.ndarray]:
    """`replay`, and the node map from `index` to the result (delta.node_to_new)."""
    c = segment.change
    if len(c.removed) and int(c.removed.max()) >= len(index.passage_keys):
        raise IndexFormatError(f"{path}: segment {version} removes passage rows the version "
                               "before it lacks")
    plan = plan_change(index, c)
    _check_fits(path, version, segment, len(plan.new_phrase_rows), len(plan.new_fact_rows))
    new, _ = apply_change(index, c, plan, segment.vectors, index.config, torch.device("cpu"),
                          synonyms=segment.synonyms, pending=pending)
    _check_counts(path, version, expected_counts(new), segment.expect)
    new.path, new.version, new.timings = index.path, version, index.timings
    return new, node_to_new(plan)


def _check_fits(path: Path, version: int, segment: Segment, phrases: int, facts: int) -> None:
    v = segment.vectors
    shapes = {"passages": (len(segment.change.passages), v.passages.shape[0]),
              "phrases": (phrases, v.phrases.shape[0]), "facts": (facts, v.facts.shape[0])}
    bad = [f"{k}: {a} new, {b} vectors" for k, (a, b) in shapes.items() if a != b]
    if bad:
        raise IndexFormatError(f"{path}: segment {version} does not fit the version before it "
                               f"({'; '.join(bad)})")


def _check_counts(path: Path, version: int, got: dict[str, int], want: dict[str, int]) -> None:
    if got != want:
        raise IndexFormatError(f"{path}: replaying segment {version} gives {got}, the commit "
                               f"recorded {want}")


# -- the walk: occurrence counts of every text over the alive passages ---------------------------


class _Counts(Generic[K]):
    """How many triple occurrences of the alive passages use each text: the base's rows in an
    array, texts the base lacks by key; `alive` is how many texts have a count above zero."""

    def __init__(self, base: np.ndarray) -> None:
        self.base = base.astype(np.int64)
        self.extra: dict[K, int] = {}
        self.alive = int((self.base > 0).sum())

    def fresh(self, rows: np.ndarray, keys: Sequence[K]) -> tuple[np.ndarray, set[K]]:
        """Of the texts named (base rows; `keys` for the row -1 entries, in order), those with
        count 0: (base rows, sorted unique; keys, a set)."""
        b = np.unique(rows[rows >= 0])
        return b[self.base[b] == 0], {k for k in keys if self.extra.get(k, 0) == 0}

    def add(self, rows: np.ndarray, keys: Sequence[K], sign: int) -> None:
        b = rows[rows >= 0]
        if len(b):
            u = np.unique(b)
            before = int((self.base[u] > 0).sum())
            np.add.at(self.base, b, sign)
            if (self.base[u] < 0).any():
                raise ValueError("a count fell below zero")
            self.alive += int((self.base[u] > 0).sum()) - before
        for k in keys:
            c = self.extra.get(k, 0) + sign
            if c < 0:
                raise ValueError("a count fell below zero")
            self.alive += (c > 0) - (c - sign > 0)
            if c:
                self.extra[k] = c
            else:
                del self.extra[k]

    def is_alive(self, row: int, key: K) -> bool:
        return (self.base[row] if row >= 0 else self.extra.get(key, 0)) > 0


@dataclass
class _Uses:
    """The texts of some passages' triple occurrences: phrase rows of the base (subjects then
    objects; -1 where the base lacks the phrase, named in `phrase_keys` in order) and fact rows
    (-1 where the base lacks the fact, named in `fact_keys`)."""

    phrase_rows: np.ndarray
    fact_rows: np.ndarray
    phrase_keys: list[str] = field(default_factory=list)
    fact_keys: list[Triple] = field(default_factory=list)

    @staticmethod
    def join(parts: Sequence[_Uses]) -> _Uses:
        return _Uses(np.concatenate([np.zeros(0, np.int64)] + [u.phrase_rows for u in parts]),
                     np.concatenate([np.zeros(0, np.int64)] + [u.fact_rows for u in parts]),
                     [k for u in parts for k in u.phrase_keys],
                     [k for u in parts for k in u.fact_keys])


class _Base:
    """The base's tables, searched: where a string or triple sits in them."""

    def __init__(self, index: Index) -> None:
        self.phrases, self.predicates = index.phrases, index.predicates
        self.spo = np.asarray(index.facts.spo, dtype=np.int64).reshape(-1, 3)  # type: ignore
        t = index.passage_triples
        self.ptr = np.asarray(t.ptr, dtype=np.int64)  # type: ignore[attr-defined]
        self.occ = np.asarray(t.rows, dtype=np.int64)  # type: ignore[attr-defined]

    def phrase_pos(self, s: str) -> tuple[int, bool]:
        """(bisect position, whether the base holds `s` there)."""
        b = sorted_position(self.phrases, s)
        return b, b < len(self.phrases) and self.phrases[b] == s

    def _row(self, table: Sequence[str], s: str) -> int:
        b = sorted_position(table, s)
        return b if b < len(table) and table[b] == s else -1

    def uses_of_triples(self, triples: Sequence[Triple]) -> _Uses:
        q = np.array([[self._row(self.phrases, s), self._row(self.predicates, p),
                       self._row(self.phrases, o)] for s, p, o in triples],
                     dtype=np.int64).reshape(-1, 3)
        facts = np.full(len(q), -1, dtype=np.int64)
        ok = np.nonzero((q >= 0).all(axis=1))[0]
        if len(ok) and len(self.spo):
            pos = lex_search(self.spo, q[ok], len(self.phrases), len(self.predicates))
            hit = pos < len(self.spo)
            hit[hit] = (self.spo[pos[hit]] == q[ok[hit]]).all(axis=1)
            facts[ok[hit]] = pos[hit]
        rows = np.concatenate([q[:, 0], q[:, 2]])
        keys = [s for s, _, _ in triples] + [o for _, _, o in triples]
        return _Uses(rows, facts, [k for r, k in zip(rows.tolist(), keys) if r < 0],
                     [t for f, t in zip(facts.tolist(), triples) if f < 0])

    def uses_of_passages(self, rows: np.ndarray) -> _Uses:
        starts, lengths = self.ptr[rows], np.diff(self.ptr)[rows]
        at = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) + \
            np.arange(int(lengths.sum()), dtype=np.int64)
        facts = self.occ[at]
        return _Uses(np.concatenate([self.spo[facts, 0], self.spo[facts, 2]]), facts)

    def fact_key(self, row: int) -> Triple:
        s, p, o = self.spo[row].tolist()
        return (self.phrases[s], self.predicates[p], self.phrases[o])


@dataclass
class _Added:
    """A passage a segment added: where its vector is, and its stored triples' uses."""

    segment: int  # position in the chain
    at: int  # row in that segment's passage vectors
    uses: _Uses


class _Walk:
    """The chain walked segment by segment (module docstring)."""

    def __init__(self, base: Index, path: Path) -> None:
        self.b, self.path = _Base(base), path
        spo, occ = self.b.spo, self.b.occ
        m = len(self.b.phrases)
        self.phrases: _Counts[str] = _Counts(np.bincount(spo[occ, 0], minlength=m) +
                               np.bincount(spo[occ, 2], minlength=m))
        self.facts: _Counts[Triple] = _Counts(np.bincount(occ, minlength=len(spo)))
        self.p0 = len(self.b.ptr) - 1
        self.alive = np.arange(self.p0, dtype=np.int64)  # base rows, then p0 + added number
        self.added: list[_Added] = []
        self.phrase_vec: dict[str, tuple[int, int]] = {}  # latest stored vector of a text
        self.fact_vec: dict[Triple, tuple[int, int]] = {}
        self.recomputed: dict[str, int] = {}  # phrase -> last segment that recomputed its list
        self.edges: list[tuple[list[str], list[str], np.ndarray]] = []  # per segment, by name
        self.extra_sorted: list[str] = []  # phrases.extra's keys in order, kept as they change
        self.extra_sorted_pos: list[int] = []  # their bisect positions in the base, same order

    def uses(self, ids: np.ndarray) -> _Uses:
        base = ids[ids < self.p0]
        return _Uses.join([self.b.uses_of_passages(base)] +
                          [self.added[int(g) - self.p0].uses for g in ids[ids >= self.p0]])

    def step(self, j: int, version: int, seg: Segment) -> None:
        c = seg.change
        if len(c.removed) and int(c.removed.max()) >= len(self.alive):
            raise IndexFormatError(f"{self.path}: segment {version} removes passage rows the "
                                   "version before it lacks")
        gone = self.uses(self.alive[c.removed])
        new = [_Added(j, i, self.b.uses_of_triples(ts)) for i, ts in enumerate(c.triples)]
        came = _Uses.join([a.uses for a in new])
        # new texts: used by an added triple, by no passage of the version before (plan_change)
        ph_rows, ph_keys = self.phrases.fresh(came.phrase_rows, came.phrase_keys)
        f_rows, f_keys = self.facts.fresh(came.fact_rows, came.fact_keys)
        new_phrases = sorted({self.b.phrases[int(r)] for r in ph_rows} | ph_keys)
        new_facts = sorted({self.b.fact_key(int(r)) for r in f_rows} | f_keys)
        _check_fits(self.path, version, seg, len(new_phrases), len(new_facts))
        self.phrase_vec.update((s, (j, i)) for i, s in enumerate(new_phrases))
        self.fact_vec.update((t, (j, i)) for i, t in enumerate(new_facts))

        for uses, sign in ((gone, -1), (came, 1)):  # removals first, as plan_change
            self.phrases.add(uses.phrase_rows, uses.phrase_keys, sign)
            self.facts.add(uses.fact_rows, uses.fact_keys, sign)
        self._follow_extra(set(gone.phrase_keys) | set(came.phrase_keys))
        self.alive = np.concatenate([np.delete(self.alive, c.removed), np.arange(
            self.p0 + len(self.added), self.p0 + len(self.added) + len(new), dtype=np.int64)])
        self.added += new
        got = {"phrases": self.phrases.alive, "facts": self.facts.alive,
               "passages": len(self.alive)}
        _check_counts(self.path, version, got, seg.expect)

        self._synonyms(j, version, seg.synonyms)

    def _names(self, rows: np.ndarray, version: int) -> list[str]:
        """The phrases at `rows` of the current version's table: its alive base rows merged
        with its alive added strings (each placed at its bisect position in the base)."""
        alive_base = np.nonzero(self.phrases.base > 0)[0]
        extra = self.extra_sorted
        pos = np.array(self.extra_sorted_pos, dtype=np.int64)
        extra_rows = np.searchsorted(alive_base, pos, side="left") + np.arange(len(extra))
        if len(rows) and (rows.min() < 0 or rows.max() >= len(alive_base) + len(extra)):
            raise IndexFormatError(f"{self.path}: segment {version}'s synonym rows are outside "
                                   "its phrase table")
        k = np.searchsorted(extra_rows, rows, side="left")
        is_extra = (k < len(extra)) & (np.append(extra_rows, -1)[k] == rows)
        base_rows = alive_base[np.where(is_extra, 0, rows - k)] if len(alive_base) else rows
        return [extra[int(i)] if x else self.b.phrases[int(r)]
                for x, i, r in zip(is_extra.tolist(), k.tolist(), base_rows.tolist())]

    def _follow_extra(self, keys: set[str]) -> None:
        """Keep extra_sorted (and extra_sorted_pos) equal to sorted(phrases.extra) after a
        segment changed the counts of `keys`: O(change) searches and list moves, where
        sorting every alive added phrase again each segment was O(k log k) per segment."""
        for k in keys:
            i = bisect.bisect_left(self.extra_sorted, k)
            listed = i < len(self.extra_sorted) and self.extra_sorted[i] == k
            if k in self.phrases.extra and not listed:
                self.extra_sorted.insert(i, k)
                self.extra_sorted_pos.insert(i, self.b.phrase_pos(k)[0])
            elif listed and k not in self.phrases.extra:
                del self.extra_sorted[i], self.extra_sorted_pos[i]

    def _synonyms(self, j: int, version: int, s: SynonymUpdate) -> None:
        rows = np.concatenate([s.affected, s.edges.src, s.edges.dst]).astype(np.int64)
        uniq, inv = np.unique(rows, return_inverse=True)
        names = self._names(uniq, version)
        named = [names[i] for i in inv.reshape(-1).tolist()]
        a, e = len(s.affected), len(s.edges.src)
        self.recomputed.update((x, j) for x in named[:a])
        self.edges.append((named[a:a + e], named[a + e:], np.asarray(s.edges.score, np.float32)))


# -- the composed change ---------------------------------------------------------------------------


def replay_chain(index: Index, chain: Sequence[tuple[int, Segment]], *,
                 path: Path) -> tuple[Index, np.ndarray]:
    """The version the segments `chain` ((version, segment) in order) produce from `index`,
    equal to replaying them one by one (module docstring), and the node map from `index` to it
    (delta.node_to_new of the one composed change); its embeddings are PendingRows (the caller
    settles them)."""
    if len(chain) == 1:
        version, seg = chain[0]
        return replay_mapped(index, seg, path=path, version=version, pending=True)
    walk = _Walk(index, path)
    for j, (version, seg) in enumerate(chain):
        walk.step(j, version, seg)
    segs = [s for _, s in chain]
    version = chain[-1][0]

    kept = walk.alive[walk.alive >= walk.p0] - walk.p0
    added = [walk.added[int(g)] for g in kept]
    removed = np.setdiff1d(np.arange(walk.p0, dtype=np.int64), walk.alive[walk.alive < walk.p0])

    def pick(rows: Sequence[tuple[int, int]], what: str) -> torch.Tensor:
        mats = [getattr(s.vectors, what).float() for s in segs]
        dim = int(mats[0].shape[1])
        if not rows:
            return torch.zeros(0, dim)
        return torch.stack([mats[j][i] for j, i in rows])

    def parts(a: _Added) -> tuple[Passage, list[Triple], dict[str, int], bool]:
        c = segs[a.segment].change
        return c.passages[a.at], c.triples[a.at], c.malformed[a.at], c.error[a.at]

    rows = [parts(a) for a in added]
    change = Change(removed=removed, passages=[r[0] for r in rows],
                    triples=[r[1] for r in rows], malformed=[r[2] for r in rows],
                    error=[r[3] for r in rows])
    plan = plan_change(index, change)
    new_phrases = sorted(walk.phrases.extra)
    new_facts = sorted(walk.facts.extra)  # type: ignore[type-var]
    got_phrases = [plan.phrases[int(r)] for r in plan.new_phrase_rows]
    got_facts = [(plan.phrases[int(s)], plan.predicates[int(p)], plan.phrases[int(o)])
                 for s, p, o in plan.spo[plan.new_fact_rows].tolist()]
    if got_phrases != new_phrases or got_facts != new_facts:
        raise IndexFormatError(f"{path}: the segments up to {version} do not compose (the "
                               "texts they add disagree with their stored triples)")
    vectors = NewVectors(pick([(a.segment, a.at) for a in added], "passages"),
                         pick([walk.phrase_vec[s] for s in new_phrases], "phrases"),
                         pick([walk.fact_vec[t] for t in new_facts], "facts"))
    synonyms = _composed_synonyms(walk, plan.phrases, path, version)
    new, _ = apply_change(index, change, plan, vectors, index.config, torch.device("cpu"),
                          synonyms=synonyms, pending=True)

    # base texts that died and came back: the vector of the segment that brought them back
    b = walk.b
    back_ph = [s for s in walk.phrase_vec if s not in walk.phrases.extra and
               walk.phrases.is_alive(b._row(b.phrases, s), s)]
    back_f = [t for t in walk.fact_vec if t not in walk.facts.extra and
              walk.facts.is_alive(_fact_row(b, t), t)]
    _override(new.phrase_emb, np.array([sorted_position(plan.phrases, s)
                                        for s in back_ph], dtype=np.int64),
              pick([walk.phrase_vec[s] for s in back_ph], "phrases"))
    _override(new.fact_emb, _plan_fact_rows(plan, back_f),
              pick([walk.fact_vec[t] for t in back_f], "facts"))
    new.report["synonym_knn"]["recomputed_phrases"] = int(len(segs[-1].synonyms.affected))
    _check_counts(path, version, expected_counts(new), segs[-1].expect)
    new.path, new.version, new.timings = index.path, version, index.timings
    return new, node_to_new(plan)


def _fact_row(b: _Base, t: Triple) -> int:
    return int(b.uses_of_triples([t]).fact_rows[0])


def _plan_fact_rows(plan, facts: Sequence[Triple]) -> np.ndarray:  # type: ignore[no-untyped-def]
    if not facts:
        return np.zeros(0, np.int64)
    q = np.array([[sorted_position(plan.phrases, s), sorted_position(plan.predicates, p),
                   sorted_position(plan.phrases, o)] for s, p, o in facts], dtype=np.int64)
    return lex_search(plan.spo, q, len(plan.phrases), len(plan.predicates))


def _override(emb: object, rows: np.ndarray, vectors: torch.Tensor) -> None:
    if not len(rows):
        return
    assert isinstance(emb, PendingRows)
    emb.sources.append(vectors)
    emb.src[rows] = len(emb.sources) - 1
    emb.row[rows] = np.arange(len(rows))


def _composed_synonyms(walk: _Walk, phrases: Sequence[str], path: Path,
                       version: int) -> SynonymUpdate:
    """The chain's synonym lists as one update of the base (module docstring, Synonyms)."""
    def row(s: str) -> int:
        r = sorted_position(phrases, s)
        if r >= len(phrases) or phrases[r] != s:
            raise IndexFormatError(f"{path}: the segments up to {version} keep a synonym of a "
                                   "phrase no passage uses")
        return r

    def alive(s: str) -> bool:
        return s in walk.phrases.extra or walk.phrases.is_alive(walk.b._row(walk.b.phrases, s), s)

    src: list[int] = []
    dst: list[int] = []
    score: list[np.ndarray] = []
    for j, (s_names, d_names, sc) in enumerate(walk.edges):
        keep = [i for i, s in enumerate(s_names) if walk.recomputed.get(s) == j and alive(s)]
        src += [row(s_names[i]) for i in keep]
        dst += [row(d_names[i]) for i in keep]
        score.append(sc[np.array(keep, dtype=np.int64)])
    affected = np.array(sorted(row(s) for s in walk.recomputed if alive(s)), dtype=np.int64)
    return SynonymUpdate(affected, SynonymEdges(np.array(src, dtype=np.int64),
                                                np.array(dst, dtype=np.int64),
                                                np.concatenate(score).astype(np.float32)))
