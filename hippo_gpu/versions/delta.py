"""The next index version from the last one and a change: append passages, remove passages.

A fresh build (indexing.build.assemble_index) lays an index out canonically: M phrase rows
(sorted unique normalised subjects and objects), then P passage rows (corpus order); R sorted
predicates; F facts sorted as (subject rank, predicate rank, object rank); per passage its triple
occurrences as fact rows. This module computes the canonical layout of the changed corpus (kept
passages in their order, then the added ones) from the previous layout, without re-reading any
triple of an unchanged passage:

  1. What survives. An old phrase, predicate or fact is alive in the new version iff some kept
     or added passage's triples use it (a fact's occurrence count over the kept passages is one
     bincount of the stored occurrence rows; a phrase lives iff a live fact names it). The added
     triples' strings are looked up in the old sorted tables by binary search (O(log M) each).
  2. The new ranks. Removing rows and inserting new strings into a sorted table keeps the order
     of the survivors, so an old row r moves to  r − #(dead rows < r) + #(new strings placed
     before r); a new string found at bisect position b (old rows < b sort before it, rows >= b
     after it, none equal) lands at #(live rows < b) + its rank among the new strings at b.
     Every remap is therefore monotone: a sorted array of old rows stays sorted after it, which
     is why facts (sorted by rank triples), the passage-phrase incidence (sorted by passage then
     phrase) and the synonym lists need no re-sort, only the new rows merged in.
  3. Vectors are copied for every surviving text (by runs: placed_rows) and asked of the caller for
     the texts the old version lacks (the new passages, phrases and facts): the writer encodes
     them, a segment replay reads them from the segment (`NewVectors`).
  4. Synonyms: `indexing.synonyms.update_synonym_rows` recomputes only the lists that can
     change (its docstring proves which), or the caller supplies the recomputed lists (a
     replay).
  5. The graph: fact-pair counts follow from the facts and their occurrence counts (a triple
     (s, p, o) occurring c times adds c to (s, o) and to (o, s), as extract_elements counts it
     per occurrence); indexing.graph.patch_graph recomputes the adjacency rows of the nodes the
     change touches from them, the synonym and the passage edges by build_graph's own
     functions, and renumbers every other entry (its proof: an entry with two untouched ends is
     unchanged).

Claim: the result equals `assemble_index` of the changed corpus (same rows, same weights, same
vectors when the caller's new vectors are those a build would compute), because each table is
the sorted set a build computes (1, 2), the per-passage occurrence rows are the same facts in
the same order, and the graph's changed entries are computed by the same functions from the
same statistics (5).
`tests/versions/test_writes_equal_a_rebuild.py` checks it against fresh builds over random
operation sequences.

Cost: O(change · log M) Python work (the lookups and the new texts), and array work over the
index's rows at memory speed (remaps, run copies, bincounts over the occurrences, elementwise
passes over the adjacency): no Python object and no sort per unchanged phrase, fact or passage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch

from hippo_gpu.config import IndexConfig
from hippo_gpu.data import Passage, Triple
from hippo_gpu.indexing.graph import GraphPart, fact_text, patch_graph
from hippo_gpu.indexing.index import Index, triple_counts, triple_report
from hippo_gpu.indexing.synonyms import (
    SynonymEdges,
    concat_edges,
    kept_synonyms,
    resolve_knn_backend,
    update_synonym_rows,
)
from hippo_gpu.tables import FactTable, PassageTriples, StringTable, sorted_position
from hippo_gpu.versions.placed_rows import placed

__all__ = ["Change", "NewVectors", "Plan", "SynonymUpdate", "apply_change", "change_counts",
           "lex_search", "new_texts", "node_to_new", "plan_change"]


@dataclass
class Change:
    """Passages to remove (rows of the base version) and passages to append, with their
    normalised triples (in OpenIE order, with multiplicity), malformed counts and error flags."""

    removed: np.ndarray  # [r] int64 sorted unique passage rows of the base
    passages: list[Passage] = field(default_factory=list)
    triples: list[list[Triple]] = field(default_factory=list)
    malformed: list[dict[str, int]] = field(default_factory=list)
    error: list[bool] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not len(self.removed) and not self.passages


@dataclass
class Plan:
    """The new layout (module docstring, steps 1-2), before any vector or edge."""

    phrases: StringTable  # [M'] sorted
    predicates: StringTable  # [R'] sorted
    spo: np.ndarray  # [F', 3] int64 sorted rank triples
    phrase_to_new: np.ndarray  # [M] new row of each old phrase row, -1 if gone
    fact_to_new: np.ndarray  # [F] new row of each old fact row, -1 if gone
    new_phrase_rows: np.ndarray  # [k_m] rows (new numbering) of phrases the base lacks
    new_fact_rows: np.ndarray  # [k_f] rows of facts the base lacks
    keep: np.ndarray  # [P] bool: old passages kept
    passage_to_new: np.ndarray  # [P] new passage row of each old one, -1 if removed
    occ_ptr: np.ndarray  # [P' + 1] int64
    occ_fact: np.ndarray  # [T'] int64 fact rows of each triple occurrence


@dataclass
class NewVectors:
    """[n, D] float32 unit vectors of the texts the base lacks, in the plan's row order."""

    passages: torch.Tensor  # [A] one per added passage
    phrases: torch.Tensor  # [k_m] one per Plan.new_phrase_rows
    facts: torch.Tensor  # [k_f] one per Plan.new_fact_rows


@dataclass
class SynonymUpdate:
    """The synonym lists recomputed by a change: the affected source rows (new numbering) and
    their accepted edges; every other list is the base's, renumbered."""

    affected: np.ndarray  # [a] int64 phrase rows
    edges: SynonymEdges  # sources among `affected`


# -- step 1-2: the new sorted tables ---------------------------------------------------------------


def _as_table(strings: Sequence[str]) -> StringTable:
    return strings if isinstance(strings, StringTable) else StringTable.from_strings(strings)


def _merge_sorted(old: Sequence[str], alive: np.ndarray,
                  wanted: set[str]) -> tuple[StringTable, np.ndarray, np.ndarray, np.ndarray]:
    """The sorted table of the alive old strings and `wanted` (strings the change uses).

    Returns (table, old_to_new [n_old] (-1 if gone), rows of the strings the old table lacks
    (new numbering, sorted), and `alive` updated with the wanted old strings).
    """
    n = len(old)
    alive = alive.copy()
    fresh: list[tuple[int, str]] = []  # (bisect position in the old table, string)
    for s in wanted:
        b = sorted_position(old, s)
        if b < n and old[b] == s:
            alive[b] = True
        else:
            fresh.append((b, s))
    fresh.sort()
    at = np.fromiter((b for b, _ in fresh), dtype=np.int64, count=len(fresh))
    live_before = np.concatenate([[0], np.cumsum(alive)]).astype(np.int64)  # [n + 1]
    rows = np.arange(n, dtype=np.int64)
    # old row r: live rows before it, plus the fresh strings placed at positions <= r
    old_to_new = live_before[:-1] + np.searchsorted(at, rows, side="right")
    old_to_new[~alive] = -1
    new_rows = live_before[at] + np.arange(len(fresh), dtype=np.int64)
    table = _as_table(old).splice(alive, at, [s for _, s in fresh])
    return table, old_to_new, new_rows, alive


def _rank_keys(spo: np.ndarray, m: int, r: int) -> np.ndarray | None:
    """One int64 key per rank triple that sorts like the triple, or None if it could overflow."""
    if (max(m, 1) * max(r, 1)) * max(m, 1) >= 1 << 62:
        return None
    return (spo[:, 0] * max(r, 1) + spo[:, 1]) * max(m, 1) + spo[:, 2]


def lex_search(sorted_spo: np.ndarray, queries: np.ndarray, m: int, r: int) -> np.ndarray:
    """Left insertion positions of rank triples `queries` [k, 3] in `sorted_spo` [F, 3]."""
    keys = _rank_keys(sorted_spo, m, r)
    if keys is not None:
        return np.searchsorted(keys, _rank_keys(queries, m, r))  # type: ignore[arg-type]
    out = np.empty(len(queries), dtype=np.int64)  # huge tables: one row at a time, by columns
    sp = sorted_spo[:, 0] * max(r, 1) + sorted_spo[:, 1]
    for i, (s, p, o) in enumerate(queries.tolist()):
        key = s * max(r, 1) + p
        lo, hi = np.searchsorted(sp, key, "left"), np.searchsorted(sp, key, "right")
        out[i] = lo + np.searchsorted(sorted_spo[lo:hi, 2], o)
    return out


def plan_change(base: Index, change: Change) -> Plan:
    """The new tables and row maps of `change` applied to `base` (module docstring, 1-2)."""
    triples = base.passage_triples
    if not isinstance(triples, PassageTriples) or not isinstance(base.facts, FactTable):
        raise TypeError("plan_change needs an index whose facts and passage triples are row "
                        "tables (any built or loaded index)")
    ptr, occ = np.asarray(triples.ptr, dtype=np.int64), np.asarray(triples.rows, dtype=np.int64)
    spo_old = np.asarray(base.facts.spo, dtype=np.int64).reshape(-1, 3)
    p_old, f_old = len(ptr) - 1, len(spo_old)
    keep = np.ones(p_old, dtype=bool)
    keep[change.removed] = False
    if len(change.removed):
        kept_occ: np.ndarray | slice = np.repeat(keep, np.diff(ptr))
        fact_alive = np.bincount(occ[kept_occ], minlength=f_old) > 0
        phrase_alive = np.zeros(len(base.phrases), dtype=bool)
        phrase_alive[spo_old[fact_alive, 0]] = True
        phrase_alive[spo_old[fact_alive, 2]] = True
        pred_alive = np.zeros(len(base.predicates), dtype=bool)
        pred_alive[spo_old[fact_alive, 1]] = True
    else:  # every stored fact occurs, every phrase and predicate is named by one: all stay
        kept_occ = slice(None)
        fact_alive = np.ones(f_old, dtype=bool)
        phrase_alive = np.ones(len(base.phrases), dtype=bool)
        pred_alive = np.ones(len(base.predicates), dtype=bool)
    added = [t for ts in change.triples for t in ts]
    phrases, ph_map, new_ph_rows, _ = _merge_sorted(
        base.phrases, phrase_alive, {x for s, _, o in added for x in (s, o)})
    predicates, pr_map, _, _ = _merge_sorted(base.predicates, pred_alive, {p for _, p, _ in added})
    m, r = len(phrases), len(predicates)

    # the added occurrences as new rank triples; old facts (alive or revived) found by search
    ph_row = _row_lookup(phrases)
    pr_row = _row_lookup(predicates)
    add_spo = np.array([[ph_row(s), pr_row(p), ph_row(o)] for s, p, o in added],
                       dtype=np.int64).reshape(-1, 3)
    fact_to_new = np.full(f_old, -1, dtype=np.int64)
    s_new, p_new, o_new = ph_map[spo_old[:, 0]], pr_map[spo_old[:, 1]], ph_map[spo_old[:, 2]]
    revivable = (s_new >= 0) & (p_new >= 0) & (o_new >= 0)  # every part alive in the new tables
    spo_new_old = np.stack([s_new, p_new, o_new], axis=1)  # [F, 3] (-1 where gone)
    del s_new, p_new, o_new
    cand = np.nonzero(revivable)[0]  # sorted by new ranks too (monotone maps)
    uniq_add, add_inv = np.unique(add_spo, axis=0, return_inverse=True) if len(add_spo) else \
        (np.zeros((0, 3), np.int64), np.zeros(0, np.int64))
    cand_spo = spo_new_old if len(cand) == f_old else spo_new_old[cand]  # (no copy if all)
    pos = lex_search(cand_spo, uniq_add, m, r) if len(cand) else \
        np.zeros(len(uniq_add), np.int64)
    found = (pos < len(cand)) & (spo_new_old[cand[np.minimum(pos, max(len(cand) - 1, 0))]]
                                 == uniq_add).all(axis=1) if len(cand) else \
        np.zeros(len(uniq_add), bool)
    fact_alive[cand[pos[found]]] = True
    old_live = np.nonzero(fact_alive)[0]
    brand_new = uniq_add[~found]  # sorted (np.unique)
    live_spo = spo_new_old if len(old_live) == f_old else spo_new_old[old_live]
    at = lex_search(live_spo, brand_new, m, r) if len(live_spo) else \
        np.zeros(len(brand_new), np.int64)
    new_fact_rows = at + np.arange(len(brand_new), dtype=np.int64)
    spo = np.insert(live_spo, at, brand_new, axis=0) if len(brand_new) else live_spo
    fact_to_new[old_live] = np.arange(len(old_live)) + np.searchsorted(
        at, np.arange(len(old_live)), side="right")
    # each added occurrence's new fact row
    uniq_rows = np.empty(len(uniq_add), dtype=np.int64)
    uniq_rows[found] = fact_to_new[cand[pos[found]]]
    uniq_rows[~found] = new_fact_rows

    lengths = np.concatenate([np.diff(ptr)[keep],
                              np.fromiter(map(len, change.triples), np.int64,
                                          count=len(change.triples))])
    occ_ptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    occ_fact = np.concatenate([fact_to_new[occ[kept_occ]], uniq_rows[add_inv.reshape(-1)]])
    return Plan(phrases=phrases, predicates=predicates, spo=np.ascontiguousarray(spo),
                phrase_to_new=ph_map, fact_to_new=fact_to_new, new_phrase_rows=new_ph_rows,
                new_fact_rows=new_fact_rows, keep=keep,
                passage_to_new=np.where(keep, np.cumsum(keep) - 1, -1), occ_ptr=occ_ptr,
                occ_fact=occ_fact.astype(np.int64))


def node_to_new(plan: Plan) -> np.ndarray:
    """[N] the new node row of each old node row (phrases, then passages: the canonical layout),
    −1 for a removed one. Monotone on the kept nodes (module docstring, step 2)."""
    m_new = len(plan.phrases)
    return np.concatenate([plan.phrase_to_new,
                           np.where(plan.keep, plan.passage_to_new + m_new, -1)]).astype(np.int64)


def _row_lookup(table: Sequence[str]) -> Callable[[str], int]:
    """Row of a string known to be in the sorted `table` (binary search)."""
    def row(s: str) -> int:
        return sorted_position(table, s)
    return row


def new_texts(plan: Plan) -> tuple[list[str], list[str]]:
    """(phrase texts, fact texts) the base lacks, in Plan.new_phrase_rows / new_fact_rows order
    (what must be embedded)."""
    ph = plan.phrases
    facts = FactTable(ph, plan.predicates, plan.spo)
    return ([ph[int(i)] for i in plan.new_phrase_rows],
            [fact_text(facts[int(j)]) for j in plan.new_fact_rows])


# -- steps 3-5: vectors, synonyms, graph -----------------------------------------------------------


def apply_change(
    base: Index, change: Change, plan: Plan, vectors: NewVectors, config: IndexConfig,
    device: torch.device, *, synonyms: SynonymUpdate | None = None,
    lap: Callable[[str], None] | None = None, pending: bool = False,
) -> tuple[Index, SynonymUpdate]:
    """The new version (module docstring, 3-5) and the synonym lists it recomputed.

    Args:
        base: the previous version (on the CPU).
        change, plan: the change and `plan_change(base, change)`.
        vectors: the vectors of the texts the base lacks (`new_texts(plan)` and the added
            passages' contents).
        synonyms: the recomputed lists, when known (a segment replay); None computes them.
        lap: called with each stage's name as it ends ("embed_copy", "synonym_knn",
            "adjacency").
        pending: leave the embeddings as PendingRows (a replay of several segments, which
            `settle`s the last version only); needs `synonyms`.

    The returned index has no basis (it depends on the whole graph: a compaction,
    IndexWriter.compact, solves it).
    """
    lap = lap or (lambda name: None)
    if pending and synonyms is None:
        raise ValueError("pending embeddings need the synonym lists (a replay)")
    passage_emb, phrase_emb, fact_emb = _placed_embeddings(base, change, plan, vectors, pending)
    lap("embed_copy")
    old_edges = SynonymEdges(base.synonym_src.numpy(), base.synonym_dst.numpy(),
                             base.synonym_score.float().numpy())
    edges, synonyms = _next_synonyms(base, plan, old_edges, phrase_emb, config, device,
                                     synonyms)
    lap("synonym_knn")
    incidence = _incidence(base, plan, len(change.passages))
    adjacency, counts = _patched_graph(base, change, plan, edges, old_edges, synonyms,
                                       *incidence, config)
    lap("adjacency")
    malformed, error, report = _passage_records(base, change, plan, synonyms)
    inc_passage, inc_phrase = incidence
    keys, titles, texts = _passage_texts(base, change, plan)
    m, facts = len(plan.phrases), FactTable(plan.phrases, plan.predicates, plan.spo)
    index = Index(
        config=config,
        adjacency=adjacency,
        passage_nodes=torch.arange(m, m + len(keys), dtype=torch.int64),
        passage_keys=keys,
        passage_titles=titles,
        passage_texts=texts,
        phrases=plan.phrases,
        predicates=plan.predicates,
        facts=facts,
        fact_phrases=torch.from_numpy(np.ascontiguousarray(plan.spo[:, [0, 2]])),
        phrase_passage_counts=torch.from_numpy(
            np.bincount(inc_phrase, minlength=m).astype(np.int64)),
        incidence_phrase=torch.from_numpy(inc_phrase),
        incidence_passage=torch.from_numpy(inc_passage),
        passage_emb=cast(torch.Tensor, passage_emb),  # PendingRows in a replay until settle()
        phrase_emb=cast(torch.Tensor, phrase_emb),
        fact_emb=cast(torch.Tensor, fact_emb),
        counts=counts,
        report=report,
        passage_triples=PassageTriples(facts, plan.occ_ptr, plan.occ_fact),
        passage_malformed=malformed,
        passage_error=error,
        synonym_src=torch.from_numpy(edges.src.astype(np.int64)),
        synonym_dst=torch.from_numpy(edges.dst.astype(np.int64)),
        synonym_score=torch.from_numpy(edges.score.astype(np.float32)),
        labels=base.labels.after([base.passage_keys[int(r)] for r in change.removed]
                                 if base.labels else [], change.passages),
    )
    if "row_of_key" in base.__dict__:  # computed on the base: follow it, never rebuild it
        index.__dict__["row_of_key"] = base.row_of_key.spliced(
            np.nonzero(~plan.keep)[0], [p.key for p in change.passages], int(plan.keep.sum()))
    return index, synonyms


def _placed_embeddings(base: Index, change: Change, plan: Plan, vectors: NewVectors,
                       pending: bool) -> tuple[Any, Any, Any]:
    """Step 3: the new version's embedding matrices (passages [P', D], phrases [M', D], facts
    [F', D]): every surviving row copied from the base's by runs, the new texts' rows from
    `vectors`; PendingRows with `pending`."""
    phrases = placed(base.phrase_emb, plan.phrase_to_new, len(plan.phrases),
                     plan.new_phrase_rows, vectors.phrases, pending=pending)
    facts = placed(base.fact_emb, plan.fact_to_new, len(plan.spo), plan.new_fact_rows,
                   vectors.facts, pending=pending)
    kept, added = int(plan.keep.sum()), len(change.passages)
    passages = placed(base.passage_emb, plan.passage_to_new, kept + added,
                      np.arange(kept, kept + added), vectors.passages, pending=pending)
    return passages, phrases, facts


def _next_synonyms(base: Index, plan: Plan, old_edges: SynonymEdges, phrase_emb: Any,
                   config: IndexConfig, device: torch.device,
                   synonyms: SynonymUpdate | None) -> tuple[SynonymEdges, SynonymUpdate]:
    """Step 4: every accepted synonym edge of the new version and the lists it recomputed:
    computed (`synonyms` None: update_synonym_rows) or the stored ones (a replay), with every
    other list the base's, renumbered."""
    m = len(plan.phrases)
    if synonyms is None:
        removed_ph = np.nonzero(plan.phrase_to_new < 0)[0]
        backend = resolve_knn_backend(config.graph.knn_backend, device, m)
        kept, fresh, affected = update_synonym_rows(
            plan.phrase_to_new, old_edges, plan.phrases, cast(torch.Tensor, phrase_emb),
            plan.new_phrase_rows,
            base.phrase_emb.float().cpu()[torch.from_numpy(removed_ph)], config.graph,
            backend=backend, device=device)
        synonyms = SynonymUpdate(affected, fresh)
    else:  # a replay: the stored lists of the affected phrases, the rest renumbered
        is_affected = np.zeros(m, dtype=bool)
        is_affected[synonyms.affected] = True
        kept = kept_synonyms(old_edges, plan.phrase_to_new, is_affected)
    return concat_edges([kept, synonyms.edges]), synonyms


def _passage_texts(base: Index, change: Change,
                   plan: Plan) -> tuple[StringTable, StringTable, StringTable]:
    """The new version's passage keys, titles and texts [P']: the kept passages' (the base's
    tables spliced, no string decoded), then the added ones'."""
    at = np.full(len(change.passages), len(plan.keep), np.int64)  # appended after the last

    def spliced(strings: Sequence[str], new: list[str]) -> StringTable:
        return _as_table(strings).splice(plan.keep, at, new)

    added = change.passages
    return (spliced(base.passage_keys, [p.key for p in added]),
            spliced(base.passage_titles, [p.title for p in added]),
            spliced(base.passage_texts, [p.content for p in added]))


def _passage_records(base: Index, change: Change, plan: Plan, synonyms: SynonymUpdate
                     ) -> tuple[list[dict[str, int]], list[bool], dict[str, Any]]:
    """The new version's per-passage malformed counts and error flags (the kept passages',
    then the added ones') and its report, updated from the base's by what left and came."""
    removed = np.nonzero(~plan.keep)[0]
    malformed, error = _kept(base.passage_malformed, removed), _kept(base.passage_error, removed)
    lost = ([base.passage_malformed[i] for i in removed.tolist()],
            [base.passage_error[i] for i in removed.tolist()])
    malformed += [dict(x) for x in change.malformed]
    error += [bool(x) for x in change.error]
    per_passage = np.diff(plan.occ_ptr)
    report: dict[str, Any] = {**_triple_counts(base.report, lost, change, malformed, error,
                                               per_passage),
              **{k: base.report[k] for k in ("missing_passages", "extra_passages")
                 if k in base.report},
              "synonym_knn": {**base.report.get("synonym_knn", {}),
                              "recomputed_phrases": int(len(synonyms.affected))}}
    return malformed, error, report


def change_counts(base: Index, change: Change, plan: Plan,
                  update: SynonymUpdate) -> dict[str, int]:
    """What the change did, counted from the plan and the synonym update (no set of every
    phrase or fact): ChangeReport's fields."""
    to_new = plan.phrase_to_new
    m = len(plan.phrases)
    redo = np.zeros(m + 1, dtype=bool)  # the last slot stands for a removed phrase
    redo[update.affected] = True
    src = base.synonym_src.numpy()
    dst = base.synonym_dst.numpy()
    src_new = np.where(to_new[src] >= 0, to_new[src], m) if len(src) else src
    old_redo = redo[src_new] if len(src) else np.zeros(0, bool)
    old_keys = src_new[old_redo] * (m + 1) + np.where(to_new[dst[old_redo]] >= 0,
                                                      to_new[dst[old_redo]], m)
    old_keys = old_keys[(src_new[old_redo] < m) & (old_keys % (m + 1) < m)]
    fresh = update.edges.src * (m + 1) + update.edges.dst
    gone_sources = int(old_redo.sum()) - len(old_keys)  # edges of removed phrases
    return {
        "passages_added": len(change.passages),
        "passages_removed": int(len(change.removed)),
        "phrases_added": int(len(plan.new_phrase_rows)),
        "phrases_removed": int((to_new < 0).sum()),
        "facts_added": int(len(plan.new_fact_rows)),
        "facts_removed": int((plan.fact_to_new < 0).sum()),
        "synonym_pairs_added": int(len(np.setdiff1d(fresh, old_keys))),
        "synonym_pairs_removed": int(len(np.setdiff1d(old_keys, fresh))) + gone_sources,
        "synonym_phrases_recomputed": int(len(update.affected)),
    }


def _incidence(base: Index, plan: Plan, added: int) -> tuple[np.ndarray, np.ndarray]:
    """The new passage -> phrase pairs (passage rows, phrase rows), sorted by passage then
    phrase as a build's: the kept passages' pairs renumbered (monotone: still sorted), then the
    added passages'."""
    m = len(plan.phrases)
    mm = max(m, 1)
    inc_p = base.incidence_passage.numpy()
    inc_ph = base.incidence_phrase.numpy()
    keep_pair = plan.keep[inc_p]
    first = int(plan.keep.sum())
    start = int(plan.occ_ptr[first])
    occ_pas = np.repeat(np.arange(first, first + added, dtype=np.int64),
                        np.diff(plan.occ_ptr[first:]))
    occ_f = plan.occ_fact[start:]
    add_key = np.unique(np.concatenate([occ_pas * mm + plan.spo[occ_f, 0],
                                        occ_pas * mm + plan.spo[occ_f, 2]]))
    return (np.concatenate([plan.passage_to_new[inc_p[keep_pair]], add_key // mm]).astype(np.int64),
            np.concatenate([plan.phrase_to_new[inc_ph[keep_pair]], add_key % mm])
            .astype(np.int64))


def _patched_graph(base: Index, change: Change, plan: Plan, edges: SynonymEdges,
                   old_edges: SynonymEdges, update: SynonymUpdate, inc_passage: np.ndarray,
                   inc_phrase: np.ndarray,
                   config: IndexConfig) -> tuple[torch.Tensor, dict[str, int]]:
    """The new adjacency by indexing.graph.patch_graph and its edge_counts, updated from the
    base's by the counts of the dirty part before and after (the rest of the graph is the
    same)."""
    m_old, m = len(base.phrases), len(plan.phrases)
    p_new = int(plan.keep.sum()) + len(change.passages)
    n = m + p_new
    ptr = np.asarray(base.passage_triples.ptr, dtype=np.int64)  # type: ignore[attr-defined]
    occ = np.asarray(base.passage_triples.rows, dtype=np.int64)  # type: ignore[attr-defined]
    spo_old = np.asarray(base.facts.spo, dtype=np.int64)  # type: ignore[attr-defined]
    ph_map = plan.phrase_to_new
    node_to_new = np.concatenate([ph_map, np.where(plan.keep, plan.passage_to_new + m, -1)])

    dirty = np.zeros(n, dtype=bool)
    start = int(plan.occ_ptr[int(plan.keep.sum())])
    added_facts = plan.spo[plan.occ_fact[start:]]
    dirty[added_facts[:, 0]] = dirty[added_facts[:, 2]] = True
    dirty[m + int(plan.keep.sum()):] = True
    gone = spo_old[occ[np.repeat(~plan.keep, np.diff(ptr))]]
    for col in (0, 2):
        mapped = ph_map[gone[:, col]]
        dirty[mapped[mapped >= 0]] = True
    dirty[update.affected] = True
    dirty[update.edges.dst] = True
    if len(old_edges.src):  # old assignments of recomputed or removed phrases, both ends
        src_new, dst_new = ph_map[old_edges.src], ph_map[old_edges.dst]
        redo = (src_new < 0) | (dst_new < 0) | dirty[np.maximum(src_new, 0)]
        for ends in (src_new[redo], dst_new[redo]):
            dirty[ends[ends >= 0]] = True
    old_dirty = (node_to_new < 0) | dirty[np.maximum(node_to_new, 0)]

    occ_new = np.bincount(plan.occ_fact, minlength=len(plan.spo))
    part = GraphPart.touching(dirty, m, plan.spo, occ_new, edges, inc_passage, inc_phrase)
    old_part = GraphPart.touching(old_dirty, m_old, spo_old,
                                  np.bincount(occ, minlength=len(spo_old)), old_edges,
                                  base.incidence_passage.numpy(), base.incidence_phrase.numpy())
    adjacency = patch_graph(base.adjacency, node_to_new, n, m, dirty, part, config.graph)
    new_f, new_k = part.key_counts(m, config.graph)
    old_f, old_k = old_part.key_counts(m_old, config.graph)
    c = base.counts
    fact_edges = int(c["fact_edges"]) - old_f + new_f
    phrase_keys = int(c["edges"]) - int(c["passage_edges"]) - old_k + new_k
    edges_total = phrase_keys + len(inc_passage)
    return adjacency, {
        "phrase_nodes": m, "passage_nodes": p_new, "nodes": n, "facts": len(plan.spo),
        "fact_edges": fact_edges, "passage_edges": len(inc_passage),
        "synonym_edges": edges_total - len(plan.spo) - len(inc_passage), "edges": edges_total,
        "synonym_pairs": int(len(edges.src)),
    }


def _kept(items: list, removed: np.ndarray) -> list:
    """`items` without the sorted positions `removed` (C-level list copies, no loop per item)."""
    out = list(items)
    for i in removed[::-1].tolist():
        del out[i]
    return out


def _triple_counts(report: dict[str, Any], lost: tuple[list[dict[str, int]], list[bool]],
                   change: Change, malformed: list[dict[str, int]], error: list[bool],
                   per_passage: np.ndarray) -> dict[str, Any]:
    """The new version's triple counts (indexing.index.triple_report's fields): the last version's,
    less the removed passages' malformed counts and error flags, plus the added ones'; the
    whole lists are summed only when the last report lacks a field (an older index)."""
    if any(k not in report for k in ("malformed_triples", "malformed_by_reason",
                                     "passages_with_error")):
        return triple_report(malformed, error, per_passage)
    by_reason = dict(report["malformed_by_reason"])
    for sign, dicts in ((-1, lost[0]), (1, change.malformed)):
        for x in dicts:
            for reason, count in x.items():
                by_reason[reason] = by_reason.get(reason, 0) + sign * count
    with_error = int(report["passages_with_error"]) - sum(lost[1]) + \
        sum(bool(x) for x in change.error)
    return triple_counts(by_reason, with_error, per_passage)
