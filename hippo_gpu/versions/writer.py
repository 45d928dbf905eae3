"""IndexWriter: insert and delete passages on a stored index; each commit a small segment.

Semantics: after any sequence of inserts, deletes and compactions, the index equals a fresh
build of the final corpus (passages in the writer's order: kept passages in their order, then
inserted ones in insertion order) with the same OpenIE and config: the same phrases and facts
(the same rows, since both are sorted by text), the same fact, passage and synonym edges and
weights. A commit computes the new version from the last one and the change
(hippo_gpu.versions.delta proves it equal to a build), reusing two things instead of recomputing
them:

    vectors   of every text the last version holds (rows copied); texts never seen are
              encoded, through the content-addressed embedding cache. A fresh build that shares
              that cache reads the very same vectors; one without it re-encodes them, and an
              encoder's output can differ by ~1e-7 with the batch a text lands in, so a synonym
              edge whose cosine is within ~1e-7 of the threshold could then differ;
    synonyms  the accepted lists of phrases that no added or removed phrase is within the
              threshold of (indexing.synonyms.update_synonym_rows proves those lists
              unchanged).

The cost of a commit is therefore: encoding the new texts, one GEMM of the changed phrases
against all phrases, a kNN for the affected phrases, the adjacency rows of the touched nodes
(indexing.graph.patch_graph), array copies at memory speed for the rest, and writing a segment
of the change's size (storage.directory.write_segment, which returns the manifest it wrote: the
writer keeps it and reads nothing back): no triple of an unchanged passage is re-read, nothing
unchanged is rewritten. Every stage is timed in `last_change.stage_seconds`.

The passage basis (IndexConfig.ppr_basis, hippo_gpu.ppr.basis) depends on the whole graph, so a
commit leaves the new version without one (hipporag2 iterates on it until it has one). The
writer keeps the anchor of the basis updates (versions/live_basis.py: the newest version with a
basis and the node map from it to the held version, composed at each commit), so
`prepare_basis_update` + `finish_basis_update` bring the held version's basis current by a
low-rank update and store it with its segment (a server runs them in the background after its
commits); a reader that finds no stored basis updates it itself. `compact()` writes the current
version as a new base with its basis (a fresh build's within the certified bounds of both),
after which loads replay nothing. When to compact is one policy,
`compaction_due`: the writer compacts by itself after a commit that leaves `compact_after`
segments or segments over a quarter of the base's bytes; the server compacts in the background
once writes pause, or at once when the chain is due (serve/writes.py); `hippo-gpu compact`
whenever there is a segment or a stale basis.

Durability: one writer at a time (locks.writer_lock, a flock the OS drops if the writer dies);
a commit writes its segment directory (fsync) and then switches the manifest atomically;
readers keep the version they loaded and move to a later one by replaying its segments
(Searcher.refresh). A full disk at any write of a commit raises DiskFullError naming the file
(storage/directory.py): nothing is committed, the writer keeps its staged changes and the same
commit() can be retried once there is space; commit() raising always means "not committed" (a
compaction that fails after a commit is logged, not raised).
`commit()` returns the new version as an `Index` (the one it computed, not a reload: equal to
`load_index` of it), and the writer keeps it with its manifest: a writer reopened after
`close()` replays only what other writers committed since (versions.load.refresh_version), so a
long-lived writer (the server's) reads the index once; it holds the last version in host memory
(float32).

Validation happens before anything is written: inserting a passage the index (or this writer)
already holds is a no-op, deleting an unknown key is a KeyError naming it and changes nothing,
malformed input raises DataFormatError and changes nothing.

    with IndexWriter("my_index") as w:      # lock; commit on a clean exit, discard on error
        w.insert(passages, openie)          # or w.insert_docs(passages, docs): OpenIEDoc objects
        w.delete(["chunk-..."])
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hippo_gpu.data import DataFormatError, OpenIEDoc, Passage, as_passages, read_openie, short
from hippo_gpu.device import keep_large_allocations_in_heap, resolve_device, set_threads
from hippo_gpu.embed import Encoder, runnable_precision
from hippo_gpu.errors import DiskFullError
from hippo_gpu.indexing.build import Stages, corpus_state, solve_index_basis
from hippo_gpu.indexing.index import Index
from hippo_gpu.ppr.basis_update import BasisUpdate, anchor_solver
from hippo_gpu.ppr.solver import PPRSolver
from hippo_gpu.storage.directory import (
    collect_garbage,
    discard_version,
    install_base,
    prepare_base,
    read_index_dir,
    read_manifest,
    write_segment,
)
from hippo_gpu.storage.locks import writer_lock
from hippo_gpu.versions.compaction import COMPACT_AFTER, PreparedBase, compaction_due
from hippo_gpu.versions.delta import (
    Change,
    NewVectors,
    apply_change,
    change_counts,
    new_texts,
    node_to_new,
    plan_change,
)
from hippo_gpu.versions.live_basis import Anchor, store_basis, update_from_anchor
from hippo_gpu.versions.load import (
    Segment,
    expected_counts,
    load_with_anchor,
    refresh_with_anchor,
    segment_files,
)

log = logging.getLogger(__name__)

__all__ = ["ChangeReport", "IndexWriter", "PreparedUpdate"]


@dataclass(frozen=True)
class PreparedUpdate:
    """A basis update computed for a version the writer held (`prepare_basis_update`), and
    that version as the next anchor."""

    update: BasisUpdate
    anchor: Anchor

    @property
    def version(self) -> int | None:
        return self.anchor.version


@dataclass
class ChangeReport:
    """What a commit changed, and its time per stage."""

    passages_added: int = 0
    passages_removed: int = 0
    phrases_added: int = 0
    phrases_removed: int = 0
    facts_added: int = 0
    facts_removed: int = 0
    synonym_pairs_added: int = 0
    synonym_pairs_removed: int = 0
    synonym_phrases_recomputed: int = 0
    skipped_present: int = 0  # inserted passages the index already held (no-ops)
    version: int | None = None  # the version the commit left current
    compacted: bool = False  # the commit compacted the chain (stages "compact_*")
    stage_seconds: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


class IndexWriter:
    """The single writer of an index directory (see the module docstring).

    Args:
        index_dir: an existing index directory.
        device: where encoding and kNN run ("auto", "cpu", "cuda").
        cache_dir: embedding cache (texts embedded before by the same encoder are reused).
        show_progress: progress bars for encoding.
        on_step: called with each commit step's name (directory.COMMIT_STEPS) before it runs;
            fault-injection tests kill the process there.
        encoder: an already loaded Encoder of the index's encoder config to reuse (default:
            one is loaded on the first commit that has a text to encode).
        compact_after: compact (`compact`) after a commit that leaves this many segments, or
            segments of more than a quarter of the base's bytes (`compaction_due`);
            None: only when asked (a server compacts in the background instead).
        verify: check every file of the version `open` reads against the manifest's sha256
            (load_index's `verify`). False (the CLI's one-off `insert` and `delete`: hashing a
            large index costs more than their commit) checks each file's size instead and
            defers the checksums to the one step that needs them, below.

    Why skipping the checksums at open keeps every guarantee: a commit writes only its own
    segment (recording that segment's checksums) and a new manifest; it never rewrites a file
    it read, nor records a checksum of one. A file that is corrupt at open therefore stays a
    checksum mismatch on disk, and every verifying reader (load_index, a Searcher, a writer
    that verifies) refuses the index as it would have without the commit: a commit can make
    nothing corrupt readable. At worst the corrupt content makes the commit fail or its
    segment wrong (synonym lists recomputed from a corrupt vector), on an index that no
    verifying reader opens until it is rebuilt, as the checksum error says (putting back only
    the corrupt file from a backup would keep such a segment). The one step that copies what
    the writer read into files with new checksums is a compaction (a new base):
    `prepare_compaction` verifies every file of the index first when the held version was
    read unchecked. Atomicity (the manifest's rename) does not depend on any of it.
    """

    def __init__(self, index_dir: str | Path, *, device: str = "auto",
                 cache_dir: str | Path | None = None, show_progress: bool = False,
                 on_step: Callable[[str], None] | None = None,
                 encoder: Encoder | None = None,
                 compact_after: int | None = COMPACT_AFTER, verify: bool = True) -> None:
        self.index_dir = Path(index_dir)
        self.device = resolve_device(device)
        self.cache_dir = cache_dir
        self.show_progress = show_progress
        self.on_step = on_step
        self._lock: contextlib.ExitStack | None = None
        self._base: Index | None = None
        self._skipped = 0
        self._encoder: Encoder | None = encoder
        self._last_change: ChangeReport | None = None
        self.compact_after = compact_after
        self.last_compaction: dict[str, float] = {}
        self.garbage: list[str] = []  # what the last open() removed (directory.collect_garbage)
        # the manifest of the version this writer holds, as its open read it or its last commit
        # or compaction wrote it (the compaction policy's input: nothing re-reads it)
        self.manifest: dict[str, Any] = {}
        self.verify = verify
        # whether the held version was read from files whose checksums were checked (or
        # computed by this writer from such a version): a compaction may copy it as it is
        self._verified = False
        # the basis updates' anchor (versions/live_basis.py), its node map to the held version,
        # the node maps of the commits since it (version, map from the version before) and the
        # float64 solver of its graph (built on the first update from it)
        self._anchor: Anchor | None = None
        self._commit_maps: list[tuple[int, np.ndarray]] = []
        self._anchor_solver: tuple[int | None, PPRSolver] | None = None
        self.basis_update_skipped = False  # the last prepare_basis_update found it too large
        # the held version and the anchor change together (commit, finish_*): a background
        # update reads them under this lock, as one snapshot
        self._state = threading.Lock()

    # -- lifecycle -----------------------------------------------------------------------------

    def open(self) -> IndexWriter:
        """Take the writer lock, clear a killed writer's leftovers, load the current version
        (unless this writer holds it already: the version it loaded or committed last), its
        files checked against the manifest's checksums unless `verify` is False."""
        if self._lock is not None:
            return self
        read_manifest(self.index_dir)  # not an index: raise before the lock creates anything
        keep_large_allocations_in_heap()  # commits allocate index-sized arrays again and again
        stack = contextlib.ExitStack()
        stack.enter_context(writer_lock(self.index_dir))
        try:
            self.garbage = collect_garbage(self.index_dir)
            held = self._base
            if held is None:
                self._base, self.manifest, self._anchor = load_with_anchor(
                    self.index_dir, verify=self.verify, live_basis=False)
            else:  # another writer may have committed since: replay its segments
                self._base, self.manifest, self._anchor = refresh_with_anchor(
                    held, verify=self.verify, live_basis=False, anchor=self._anchor)
            if self._base is not held:
                self._commit_maps = []
            self._verified = self.verify or (self._verified and self._base is held)
            if self._encoder is not None and \
                    self._encoder.config.identity() != self._base.config.encoder.identity():
                raise ValueError(
                    f"encoder {self._encoder.config.identity()} differs from the index's "
                    f"{self._base.config.encoder.identity()}")
        except BaseException:
            stack.close()
            raise
        self._lock = stack
        self._reset()
        return self

    def close(self) -> None:
        """Release the lock; uncommitted changes are discarded."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def __enter__(self) -> IndexWriter:
        return self.open()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None and self.pending:
                self.commit()
        finally:
            self.close()

    def _reset(self) -> None:
        self._removed: set[int] = set()  # base passage rows staged for removal
        self._added = Change(removed=np.zeros(0, np.int64))  # staged passages to append
        self._added_keys: dict[str, int] = {}  # key -> position in self._added.passages
        self._skipped = 0

    def _require_base(self) -> Index:
        if self._base is None:
            raise RuntimeError("the writer is not open: use `with IndexWriter(dir) as w:`")
        return self._base

    @property
    def index(self) -> Index:
        """The last committed version (what readers see)."""
        return self._require_base()

    @property
    def last_change(self) -> ChangeReport:
        """What this writer's last commit changed, and its time per stage."""
        if self._last_change is None:
            raise RuntimeError("this writer has not committed yet")
        return self._last_change

    @property
    def pending(self) -> bool:
        """Whether inserts or deletes are waiting for a commit."""
        self._require_base()
        return bool(self._removed) or bool(self._added.passages)

    # -- changes ---------------------------------------------------------------------------------

    def insert(self, corpus: str | Path | Sequence[Passage] | Sequence[dict[str, Any]],
               openie: str | Path | dict[str, Any]) -> int:
        """Stage passages and their OpenIE output (the same formats build_index reads): the
        OpenIE of the new passages is read (data.read_openie), then staged by `insert_docs`.

        Passages already present (same title and text) are skipped. Returns how many are new.
        Raises DataFormatError (nothing staged) for malformed input or an OpenIE file that lacks
        a new passage.
        """
        self._require_base()
        passages = as_passages(corpus)
        new = self._unseen(passages)
        self._skipped += len(passages) - len(new)
        if not new:
            return 0
        docs, _report = read_openie(openie, new)  # raises before anything is staged
        return self.insert_docs(new, docs)

    def insert_docs(self, passages: Sequence[Passage], docs: Sequence[OpenIEDoc]) -> int:
        """Stage passages with their OpenIE as objects: `docs[i]` is the OpenIE of
        `passages[i]` (OpenIEDoc.from_raw checks raw triples as the file reader does).

        Passages already present are skipped. Returns how many are new. Raises DataFormatError
        (nothing staged) for duplicate passages or a docs list of another length.
        """
        self._require_base()
        passages = as_passages(passages)
        if len(docs) != len(passages):
            raise DataFormatError(f"{len(passages)} passage(s) but {len(docs)} OpenIE doc(s)")
        if not all(isinstance(d, OpenIEDoc) for d in docs):
            raise TypeError("docs must be OpenIEDoc objects (OpenIEDoc.from_raw makes them)")
        new = {p.key for p in self._unseen(passages)}
        self._skipped += len(passages) - len(new)
        if not new:
            return 0
        self._check_ids([p for p in passages if p.key in new])
        add = corpus_state([p for p in passages if p.key in new],
                           [d for p, d in zip(passages, docs) if p.key in new])
        staged = self._added
        for i, p in enumerate(add.passages):
            self._added_keys[p.key] = len(staged.passages)
            staged.passages.append(p)
            staged.triples.append(add.triples[i])
            staged.malformed.append(add.malformed[i])
            staged.error.append(add.error[i])
        return len(new)

    def _check_ids(self, passages: Sequence[Passage]) -> None:
        """DataFormatError (nothing staged) when a new passage's own id already names a
        passage of the index (not staged for removal) or a staged one."""
        base = self._require_base()
        for p in passages:
            if p.id is None:
                continue
            key = base.labels.key_of_id(p.id)
            held = key is not None and base.row_of_key[key] not in self._removed
            staged = any(q.id == p.id for q in self._added.passages)
            if held or staged:
                raise DataFormatError(f"the id {short(p.id)} already names a passage of the "
                                      "index; delete that passage first, or give another id")

    def _unseen(self, passages: Sequence[Passage]) -> list[Passage]:
        """The passages neither the index (less its staged removals) nor the staged inserts
        hold."""
        rows = self._require_base().row_of_key
        out = []
        for p in passages:
            row = rows.get(p.key)
            present = (row is not None and row not in self._removed) or \
                p.key in self._added_keys
            if not present:
                out.append(p)
        return out

    def delete(self, keys: Sequence[str]) -> int:
        """Stage the removal of passages by key ("chunk-<md5>"). An unknown key raises KeyError
        naming it, and nothing is staged. Returns how many were removed."""
        rows = self._require_base().row_of_key
        if isinstance(keys, str):
            raise TypeError("keys must be a list of passage keys, not one string")
        keys = list(dict.fromkeys(keys))
        unknown = [k for k in keys if k not in self._added_keys and
                   (rows.get(k) is None or rows[k] in self._removed)]
        if unknown:
            raise KeyError(f"{len(unknown)} unknown passage key(s), nothing deleted: "
                           f"{', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}")
        staged = [k for k in keys if k in self._added_keys]
        if staged:  # staged inserts: drop them from the staged lists
            drop = {self._added_keys[k] for k in staged}
            a = self._added
            keep = [i for i in range(len(a.passages)) if i not in drop]
            a.passages = [a.passages[i] for i in keep]
            a.triples = [a.triples[i] for i in keep]
            a.malformed = [a.malformed[i] for i in keep]
            a.error = [a.error[i] for i in keep]
            self._added_keys = {p.key: i for i, p in enumerate(a.passages)}
        self._removed.update(rows[k] for k in keys if k not in staged)
        return len(keys)

    def delete_ids(self, ids: Sequence[str]) -> int:
        """Stage the removal of the passages with these ids of their own (the corpus items'
        "id"). An unknown id raises KeyError naming it, and nothing is staged."""
        if isinstance(ids, str):
            raise TypeError("ids must be a list of passage ids, not one string")
        base = self._require_base()
        staged = {p.id: p.key for p in self._added.passages if p.id is not None}
        keys, unknown = [], []
        for i in dict.fromkeys(ids):
            key = staged.get(i) or base.labels.key_of_id(i)
            if key is None or (key not in self._added_keys and base.row_of_key[key]
                               in self._removed):
                unknown.append(i)
            else:
                keys.append(key)
        if unknown:
            raise KeyError(f"{len(unknown)} unknown passage id(s), nothing deleted: "
                           f"{', '.join(short(i) for i in unknown[:5])}"
                           f"{' ...' if len(unknown) > 5 else ''}")
        return self.delete(keys)

    def delete_titles(self, titles: Sequence[str]) -> int:
        """Stage the removal of every passage with one of `titles` (KeyError for a title that
        matches none)."""
        base = self._require_base()
        wanted = set(titles)
        by_title: dict[str, list[str]] = {}
        for row, title in enumerate(base.passage_titles):
            if title in wanted and row not in self._removed:
                by_title.setdefault(title, []).append(base.passage_keys[row])
        for p in self._added.passages:
            if p.title in wanted:
                by_title.setdefault(p.title, []).append(p.key)
        unknown = [t for t in titles if t not in by_title]
        if unknown:
            raise KeyError(f"{len(unknown)} unknown title(s), nothing deleted: "
                           f"{', '.join(unknown[:5])}")
        return self.delete([k for t in dict.fromkeys(titles) for k in by_title[t]])

    # -- commit ------------------------------------------------------------------------------------

    def commit(self) -> Index:
        """Compute the new version from the staged changes, commit it atomically and return
        it (on CPU, float32: what `load_index` of the new version gives; `last_change` says
        what changed). The writer keeps it as the base of its next changes."""
        base = self._require_base()
        set_threads()  # the server's write thread: torch's count, as for queries
        stages = Stages()

        def load_encoder() -> Encoder:
            if self._encoder is None:  # the index's encoder, at the precision this device runs
                cfg = base.config.encoder
                cfg = replace(cfg, precision=runnable_precision(cfg.precision, self.device))
                self._encoder = Encoder(cfg, self.device, cache_dir=self.cache_dir)
                stages.lap("load_encoder")
            return self._encoder

        change = self._added
        change.removed = np.array(sorted(self._removed), dtype=np.int64)
        if len(change.removed) == len(base.passage_keys) and not change.passages:
            raise DataFormatError("a commit would leave the index without passages; delete the "
                                  "index directory instead")
        plan = plan_change(base, change)
        stages.lap("plan")
        phrase_texts, fact_texts = new_texts(plan)
        dim = int(base.passage_emb.shape[1])

        def encode(texts: list[str], what: str) -> torch.Tensor:
            out = load_encoder().encode(texts, desc=f"embed {what}" if self.show_progress
                                        else None) if texts else torch.zeros(0, dim)
            stages.lap(f"embed_{what}")
            return out

        vectors = NewVectors(encode([p.content for p in change.passages], "passages"),
                             encode(phrase_texts, "phrases"), encode(fact_texts, "facts"))
        new, update = apply_change(base, change, plan, vectors, base.config, self.device,
                                   lap=stages.lap)
        counts = change_counts(base, change, plan, update)
        node_map = node_to_new(plan)
        tensors, tables = segment_files(Segment(change, vectors, update, expected_counts(new)))
        with self._keeping_version("commit"):
            manifest = write_segment(self.index_dir, {"counts": new.counts,
                                                      "openie_report": _as_json(new.report)},
                                     tensors, tables, on_step=self.on_step)
        stages.lap("save")
        version = manifest["version"]
        new.path, new.version = self.index_dir, version
        new.report = _as_json(new.report)  # as stored (JSON keys are strings)
        report = ChangeReport(**counts, skipped_present=self._skipped)  # type: ignore[arg-type]
        new.timings = stages.seconds
        report.stage_seconds = dict(stages.seconds)
        report.version = new.version
        with self._state:
            self._base, self.manifest = new, manifest
            if self._anchor is not None:
                self._anchor = self._anchor.after(node_map)
                self._commit_maps.append((int(version), node_map))
            self.basis_update_skipped = False
        self._last_change = report
        self._reset()
        if self.compact_after is not None and \
                compaction_due(manifest, max_segments=self.compact_after):
            try:
                new = self.compact()
            except OSError as e:  # the commit is made: a failed compaction only defers it
                log.warning("%s: committed version %s; the compaction after it failed, the "
                            "next commit tries again: %s", self.index_dir, version, e)
                return new
            report.stage_seconds.update({f"compact_{k}": v
                                         for k, v in self.last_compaction.items()})
            report.version, report.compacted = new.version, True
        return new

    @contextlib.contextmanager
    def _keeping_version(self, what: str) -> Iterator[None]:
        """A full disk during a commit or a compaction: DiskFullError naming the file (the
        directory's) and saying that the index keeps its version and the writer its changes."""
        try:
            yield
        except DiskFullError as e:
            kept = " and the writer its staged changes" if what == "commit" else ""
            err = DiskFullError(
                f"{self.index_dir}: no space left on device for the {what} (writing {e.path} "
                f"failed); nothing was committed, the index keeps version "
                f"{self._require_base().version}{kept}: free some space and run it again")
            err.errno, err.path = e.errno, e.path
            raise err from e

    def compact(self) -> Index:
        """Write the last committed version as a new base (a full copy, with its passage basis
        solved when the index keeps one) so loads stop replaying segments; the chain starts
        again from it. Readers keep what they hold; `refresh_index` moves them without a
        reload (the base's content is the version they hold). Returns the new base version;
        its stage times are `last_compaction`. (`prepare_compaction` + `finish_compaction`.)"""
        if self.pending:
            raise RuntimeError("commit (or close the writer to discard) the staged changes "
                               "before compacting")
        return self.finish_compaction(self.prepare_compaction())

    def prepare_compaction(self) -> PreparedBase:
        """The slow half of a compaction, on the last committed version as it is now: solve
        its basis and write its base directory, which no manifest names yet. It holds no
        writer lock (a server runs it in the background while commits go on); commits made
        meanwhile stay valid on top of it (directory.install_base).

        A writer opened with `verify=False` first checks every file the index's manifest
        names against its checksum, since the new base records new checksums of what was read
        unchecked (IndexFormatError on a mismatch, nothing written). It does so while open:
        under the writer lock, those files are the ones the held version was read from and
        its own commits'."""
        base = self._require_base()
        set_threads()  # the server's compactor thread: torch's count, as for queries
        stages = Stages()
        if not self._verified:
            if self._lock is None:
                raise RuntimeError("a writer opened with verify=False compacts only while "
                                   "open (its files are checked then)")
            read_index_dir(self.index_dir, verify=True)
            self._verified = True
            stages.lap("verify")
        basis = base.basis
        # a new base gets a solved basis: an updated one carries its updates' bounds
        if base.config.ppr_basis and (basis is None or basis.updates > 0):
            basis = solve_index_basis(base.adjacency, base.passage_nodes, base.passage_emb,
                                      self.device)
            stages.lap("basis")
        new = replace(base, basis=basis)
        manifest, tensors, tables, strings = new.payload()
        hold = contextlib.ExitStack()
        try:
            with self._keeping_version("compaction"):
                name, files = prepare_base(self.index_dir, tensors, tables, strings, hold=hold,
                                           on_step=self.on_step)
        except BaseException:
            hold.close()
            raise
        stages.lap("write_base")
        return PreparedBase(new, name, files, manifest, hold, stages)

    def finish_compaction(self, prepared: PreparedBase) -> Index:
        """Make a prepared base current (under the writer lock: the writer must be open).
        Returns the compacted version when no commit came after the prepared one (the writer
        then keeps it, basis included), else the writer's current version (the chain after
        the new base holds the later commits)."""
        self._require_base()
        if self._lock is None:
            raise RuntimeError("finish_compaction needs the writer open (the writer lock)")
        new = prepared.index
        try:
            with self._keeping_version("compaction"):
                manifest = install_base(self.index_dir, prepared.name, prepared.files,
                                        prepared.manifest, new.version, on_step=self.on_step)
        except BaseException:
            discard_version(self.index_dir, prepared.name)  # uninstalled: frees its space
            raise
        finally:
            prepared.hold.close()
        prepared.stages.lap("install")
        self.last_compaction = dict(prepared.stages.seconds)
        self.manifest = manifest  # names the held version either way (below)
        with self._state:
            if self._require_base().version == new.version:  # nothing committed meanwhile
                new.version = manifest["version"]
                self._base = new
                self._anchor, self._commit_maps = Anchor.of(new), []
        return self._require_base()

    @property
    def updates_basis(self) -> bool:
        """Whether `prepare_basis_update` can bring the held version's basis current (it has
        an anchor and the last attempt was not too large): then a missing basis is no reason
        to compact."""
        return self._anchor is not None and not self.basis_update_skipped

    # -- the live basis (versions/live_basis.py) -------------------------------------------------

    def prepare_basis_update(self) -> PreparedUpdate | None:
        """The slow half of a basis update: the held version's basis updated from the anchor
        (no lock needed: it reads the held version and the anchor as they are now; a server
        runs it in the background while commits go on). None when the held version has a
        basis, there is no anchor, or the update would be too large (live_basis.MAX_SHARE)."""
        with self._state:
            held, anchor = self._require_base(), self._anchor
        if held.basis is not None or anchor is None or not held.config.ppr_basis:
            return None
        set_threads()  # the server's background thread: torch's count, as for queries
        solver = None
        if self._anchor_solver is not None and self._anchor_solver[0] == anchor.version:
            solver = self._anchor_solver[1]
        elif held.num_nodes:
            solver = anchor_solver(anchor.adjacency, anchor.basis.damping)
            self._anchor_solver = (anchor.version, solver)
        update = update_from_anchor(anchor, held, solver=solver)
        if update is None:
            self.basis_update_skipped = True
            return None
        return PreparedUpdate(update, Anchor(held.version, held.adjacency, held.passage_nodes,
                                             held.passage_emb, update.basis))

    def finish_basis_update(self, prepared: PreparedUpdate) -> Index | None:
        """Make a prepared update's version the anchor; returns the held version with its basis
        when it is the one updated (serve it), else None (commits came meanwhile: the next
        update starts from this one and folds them). Then `store_basis_update` stores it and
        `warm_anchor_solver` builds the next update's solver, both off the commit-to-serve
        path (a server runs them after switching its queries)."""
        with self._state:
            return self._adopt(prepared)

    def store_basis_update(self, prepared: PreparedUpdate) -> bool:
        """Store a finished update's basis with its version's segment (live_basis.store_basis),
        so a reader that opens that version later reads it instead of updating it."""
        return store_basis(self.index_dir, prepared.version, prepared.update.basis)

    def warm_anchor_solver(self) -> None:
        """Build the float64 solver of the current anchor's graph now (the next
        `prepare_basis_update` would build it first)."""
        with self._state:
            anchor = self._anchor
        if anchor is None or (self._anchor_solver is not None
                              and self._anchor_solver[0] == anchor.version):
            return
        set_threads()
        self._anchor_solver = (anchor.version,
                               anchor_solver(anchor.adjacency, anchor.basis.damping))

    def _adopt(self, prepared: PreparedUpdate) -> Index | None:
        held, basis = self._require_base(), prepared.update.basis
        if held.version == prepared.version:
            held = replace(held, basis=basis)  # a new object: readers keep the one they hold
            self._base = held
            self._anchor, self._commit_maps = Anchor.of(held), []
            return held
        versions = [v for v, _ in self._commit_maps]
        if held.basis is None and prepared.version in versions:  # fold the later commits
            anchor = prepared.anchor
            later = self._commit_maps[versions.index(prepared.version) + 1:]
            for _, node_map in later:
                anchor = anchor.after(node_map)
            self._anchor, self._commit_maps = anchor, later
        return None


def _as_json(report: dict[str, Any]) -> dict[str, Any]:
    """The report as the manifest stores it (JSON keys are strings)."""
    return json.loads(json.dumps(report))
