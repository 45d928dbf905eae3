"""IndexWriter: insert and delete passages on a stored index, committing atomic new versions.

Semantics: after any sequence of inserts and deletes, the index equals a fresh build of the
final corpus (passages in the writer's order: kept passages in their order, then inserted ones
in insertion order) with the same OpenIE and config: the same phrases and facts (the same rows,
since both are sorted by text), the same fact, passage and synonym edges and weights. That holds
because a commit recomputes the graph from the stored per-passage triples with the same code as
a build (build.assemble_index), and only two things are reused instead of recomputed:

    vectors   copied by text from the previous version; texts never seen are encoded, through
              the content-addressed embedding cache. A fresh build that shares that cache reads
              the very same vectors; one without it re-encodes them, and an encoder's output
              can differ by ~1e-7 with the batch a text lands in, so a synonym edge whose cosine
              is within ~1e-7 of the threshold could then differ;
    synonyms  the accepted lists of phrases that no added or removed phrase is within the
              threshold of (synonyms.update_synonym_edges proves those lists unchanged).

The passage basis (IndexConfig.ppr_basis, hippo_gpu.ppr.basis) is not reused: it depends on the
whole graph, so a commit solves it afresh like a build (stage "basis"), and it equals a fresh
build's within the certified column bounds of both (the same graph gives the same solves).

The cost of a commit is therefore: encoding the new texts, one GEMM of the changed phrases
against all phrases, a kNN for the affected phrases, rebuilding the adjacency from stored
integers (vectorised numpy) and, with the basis, D + 1 PPR solves over the whole graph, plus
writing the new version.

Durability: one writer at a time (store.writer_lock, a flock the OS drops if the writer dies);
a commit is store.write_version (new files, fsync, then an atomic manifest switch); readers keep
the version they loaded. `commit()` returns the new version as an `Index` (the one it computed,
not a reload: equal to `load_index` of it), and the writer keeps it as its base: a writer
reopened after `close()` reads the index from disk again only if the manifest no longer names
that version (same files, same checksums), so a long-lived writer (the server's) reads the index
once, not once per change; it holds that version in host memory (float32) meanwhile.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hippo_gpu.build import CorpusState, Stages, assemble_index, corpus_state
from hippo_gpu.data import DataFormatError, OpenIEDoc, Passage, as_passages, read_openie
from hippo_gpu.device import resolve_device
from hippo_gpu.embed import Encoder, runnable_precision
from hippo_gpu.index import Index, load_index
from hippo_gpu.store import collect_garbage, read_manifest, write_version, writer_lock

log = logging.getLogger(__name__)

__all__ = ["ChangeReport", "IndexWriter"]


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
    version: int | None = None
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
        on_step: called with each commit step's name (store.COMMIT_STEPS) before it runs;
            fault-injection tests kill the process there.
        encoder: an already loaded Encoder of the index's encoder config to reuse (default:
            one is loaded on the first commit that has a text to encode).
    """

    def __init__(self, index_dir: str | Path, *, device: str = "auto",
                 cache_dir: str | Path | None = None, show_progress: bool = False,
                 on_step: Callable[[str], None] | None = None,
                 encoder: Encoder | None = None) -> None:
        self.index_dir = Path(index_dir)
        self.device = resolve_device(device)
        self.cache_dir = cache_dir
        self.show_progress = show_progress
        self.on_step = on_step
        self._lock: contextlib.ExitStack | None = None
        self._base: Index | None = None
        self._base_files: dict[str, Any] | None = None  # the manifest's files of _base's version
        self._state: CorpusState | None = None
        self._skipped = 0
        self._encoder: Encoder | None = encoder
        self._last_change: ChangeReport | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def open(self) -> IndexWriter:
        """Take the writer lock, clear a killed writer's leftovers, load the current version
        (unless this writer holds it already: the version it loaded or committed last)."""
        if self._lock is not None:
            return self
        read_manifest(self.index_dir)  # not an index: raise before the lock creates anything
        stack = contextlib.ExitStack()
        stack.enter_context(writer_lock(self.index_dir))
        try:
            collect_garbage(self.index_dir)
            files = read_manifest(self.index_dir).get("files")
            if self._base is None or files != self._base_files:
                self._base, self._base_files = None, None
                self._base = load_index(self.index_dir, device="cpu")
                self._base_files = files
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
        base = self._require_base()
        self._state = CorpusState(
            passages=[Passage(title=t, text=c[len(t) + 1:])
                      for t, c in zip(base.passage_titles, base.passage_texts)],
            triples=[list(ts) for ts in base.passage_triples],
            malformed=[dict(m) for m in base.passage_malformed],
            error=list(base.passage_error),
            extra={k: int(base.report.get(k, 0)) for k in ("missing_passages", "extra_passages")},
        )
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
        base, state = self._require_base(), self._state
        return state is not None and [p.key for p in state.passages] != base.passage_keys

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
        assert self._state is not None
        passages = as_passages(passages)
        if len(docs) != len(passages):
            raise DataFormatError(f"{len(passages)} passage(s) but {len(docs)} OpenIE doc(s)")
        if not all(isinstance(d, OpenIEDoc) for d in docs):
            raise TypeError("docs must be OpenIEDoc objects (OpenIEDoc.from_raw makes them)")
        new = {p.key for p in self._unseen(passages)}
        self._skipped += len(passages) - len(new)
        if not new:
            return 0
        add = corpus_state([p for p in passages if p.key in new],
                           [d for p, d in zip(passages, docs) if p.key in new])
        self._state.passages += add.passages
        self._state.triples += add.triples
        self._state.malformed += add.malformed
        self._state.error += add.error
        return len(new)

    def _unseen(self, passages: Sequence[Passage]) -> list[Passage]:
        """The passages neither the index nor this writer's staged changes hold."""
        assert self._state is not None
        present = {p.key for p in self._state.passages}
        return [p for p in passages if p.key not in present]

    def delete(self, keys: Sequence[str]) -> int:
        """Stage the removal of passages by key ("chunk-<md5>"). An unknown key raises KeyError
        naming it, and nothing is staged. Returns how many were removed."""
        self._require_base()
        assert self._state is not None
        if isinstance(keys, str):
            raise TypeError("keys must be a list of passage keys, not one string")
        have = {p.key: i for i, p in enumerate(self._state.passages)}
        unknown = [k for k in keys if k not in have]
        if unknown:
            raise KeyError(f"{len(unknown)} unknown passage key(s), nothing deleted: "
                           f"{', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}")
        drop = {have[k] for k in keys}
        s = self._state
        keep = [i for i in range(len(s.passages)) if i not in drop]
        s.passages = [s.passages[i] for i in keep]
        s.triples = [s.triples[i] for i in keep]
        s.malformed = [s.malformed[i] for i in keep]
        s.error = [s.error[i] for i in keep]
        return len(drop)

    def delete_titles(self, titles: Sequence[str]) -> int:
        """Stage the removal of every passage with one of `titles` (KeyError for a title that
        matches none)."""
        self._require_base()
        assert self._state is not None
        by_title: dict[str, list[str]] = {}
        for p in self._state.passages:
            by_title.setdefault(p.title, []).append(p.key)
        unknown = [t for t in titles if t not in by_title]
        if unknown:
            raise KeyError(f"{len(unknown)} unknown title(s), nothing deleted: "
                           f"{', '.join(unknown[:5])}")
        return self.delete([k for t in titles for k in by_title[t]])

    # -- commit ------------------------------------------------------------------------------------

    def commit(self) -> Index:
        """Compute the new version from the staged changes, commit it atomically and return
        it (on CPU, float32: what `load_index` of the new version gives; `last_change` says
        what changed). The writer keeps it as the base of its next changes."""
        base = self._require_base()
        assert self._state is not None
        stages = Stages()

        def load_encoder() -> Encoder:
            if self._encoder is None:  # the index's encoder, at the precision this device runs
                cfg = base.config.encoder
                cfg = replace(cfg, precision=runnable_precision(cfg.precision, self.device))
                self._encoder = Encoder(cfg, self.device, cache_dir=self.cache_dir)
                stages.lap("load_encoder")
            return self._encoder

        if not self._state.passages:
            raise DataFormatError("a commit would leave the index without passages; delete the "
                                  "index directory instead")
        new = assemble_index(self._state, base.config, load_encoder, self.device,
                             previous=base, stages=stages, show_progress=self.show_progress)
        stages.lap("assemble")
        write_version(self.index_dir, *new.payload(), on_step=self.on_step)
        stages.lap("save")
        manifest = read_manifest(self.index_dir)  # under the lock: the version just written
        new.path, new.version = self.index_dir, manifest.get("version")
        new.report = json.loads(json.dumps(new.report))  # as stored (JSON keys are strings)
        report = _diff(base, new)
        report.skipped_present = self._skipped
        report.synonym_phrases_recomputed = int(
            new.report["synonym_knn"].get("recomputed_phrases", 0))
        new.timings = stages.seconds
        report.stage_seconds = stages.seconds
        report.version = new.version
        self._base, self._base_files = new, manifest.get("files")
        self._last_change = report
        self._reset()
        return new


def _diff(old: Index, new: Index) -> ChangeReport:
    def pairs(index: Index) -> set[tuple[str, str]]:
        ph = index.phrases
        return {(ph[a], ph[b]) for a, b in zip(index.synonym_src.tolist(),
                                               index.synonym_dst.tolist())}

    op, np_ = set(old.passage_keys), set(new.passage_keys)
    oph, nph = set(old.phrases), set(new.phrases)
    of, nf = set(old.facts), set(new.facts)
    osy, nsy = pairs(old), pairs(new)
    return ChangeReport(
        passages_added=len(np_ - op), passages_removed=len(op - np_),
        phrases_added=len(nph - oph), phrases_removed=len(oph - nph),
        facts_added=len(nf - of), facts_removed=len(of - nf),
        synonym_pairs_added=len(nsy - osy), synonym_pairs_removed=len(osy - nsy),
    )
