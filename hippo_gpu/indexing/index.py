"""Index: the data of one index version (tensors, tables, config), and its load/save.

An `Index` holds what indexing produced and nothing else: no encoder, no solver, no retrieval.
`indexing.build.build_index` makes one; `versions.load.load_index` reads one from disk
(`index_of_files` here makes the base version's part); `Index.to(device)` moves it;
`retrieval.searcher.Searcher` answers queries over it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hippo_gpu.config import IndexConfig, __version__
from hippo_gpu.data import Triple
from hippo_gpu.device import precision_dtype, resolve_device
from hippo_gpu.indexing.graph import fact_text, make_csr
from hippo_gpu.indexing.labels import PassageLabels
from hippo_gpu.ppr.basis import PassageBasis
from hippo_gpu.storage.directory import IndexFormatError, basis_stats, write_version
from hippo_gpu.storage.locks import servers_kept_off, writer_lock
from hippo_gpu.tables import FactTable, KeyRows, PassageTriples, StringTable

__all__ = ["Index", "IndexFormatError", "__version__", "basis_of", "basis_summary",
           "index_of_files", "triple_counts", "triple_report"]


def _md5_key(prefix: str, text: str) -> str:
    return prefix + hashlib.md5(text.encode("utf-8")).hexdigest()


@dataclass
class Index:
    """A loaded index. Node rows: M phrases, then P passages (N = M + P).

    Shapes: adjacency [N, N] sparse CSR (symmetric, float32); passage_nodes [P];
    fact_phrases [F, 2]; phrase_passage_counts [M]; passage_emb [P, D]; phrase_emb [M, D];
    fact_emb [F, D]; incidence_phrase / incidence_passage [E_p] (phrase row, passage row) pairs.

    What a writer needs to change the index exactly (hippo_gpu.versions.writer), also stored:
    passage_triples [P] lists of normalised triples (with their multiplicity), passage_malformed
    [P] malformed-triple counts by reason, passage_error [P] OpenIE error flags, and the
    accepted synonym assignments synonym_src / synonym_dst / synonym_score [S] (phrase rows).

    `basis` is the passage basis of the graph (hippo_gpu.ppr.basis: Z [P, D], z1 [P], h [N],
    float64 at every precision), solved at build and commit time when `config.ppr_basis`, else
    None (also for versions written before it existed). It is stored as basis.safetensors.

    `labels` holds the user's own ids and metadata of the labelled passages, by passage key
    (indexing/labels.py); stored in the base's tables as "passage_labels" when there are any.

    `precision` is the dtype of the device-resident embeddings, hence of every cosine computed
    from them: "float32" (the default on every device) unless "float16" or "bfloat16" is asked
    for (load_index / build_index / to). The files on disk always hold float32.

    Text fields are sequences (len, indexing, slicing, iteration, == with a list): lists after
    a build; after `load_index`, tables read from memory-mapped files on access (a passage text
    is decoded when it is read, never at load). `facts` builds a triple from integer rows
    (FactTable) and `passage_triples` from the per-passage fact rows, so neither holds a Python
    object per fact.
    """

    config: IndexConfig
    adjacency: torch.Tensor
    passage_nodes: torch.Tensor
    passage_keys: Sequence[str]
    passage_titles: Sequence[str]
    passage_texts: Sequence[str]  # title + "\n" + text, the text that was indexed
    phrases: Sequence[str]
    facts: Sequence[Triple]
    fact_phrases: torch.Tensor
    phrase_passage_counts: torch.Tensor
    incidence_phrase: torch.Tensor
    incidence_passage: torch.Tensor
    passage_emb: torch.Tensor
    phrase_emb: torch.Tensor
    fact_emb: torch.Tensor
    counts: dict[str, int]
    report: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    passage_triples: Sequence[list[Triple]] = field(default_factory=list)
    passage_malformed: list[dict[str, int]] = field(default_factory=list)
    passage_error: list[bool] = field(default_factory=list)
    synonym_src: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    synonym_dst: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    synonym_score: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    path: Path | None = None
    version: int | None = None  # the committed version this was loaded from (None: unsaved)
    precision: str = "float32"
    predicates: Sequence[str] = field(default_factory=list)  # [R] when facts is a FactTable
    basis: PassageBasis | None = None
    labels: PassageLabels = field(default_factory=PassageLabels)  # the user's ids and metadata

    @property
    def phrase_keys(self) -> list[str]:
        """Official phrase ids, "entity-" + md5(phrase), by phrase row (derived, not stored)."""
        return [_md5_key("entity-", ph) for ph in self.phrases]

    @property
    def fact_keys(self) -> list[str]:
        """Official fact ids, "fact-" + md5(str(triple)), by fact row (derived, not stored)."""
        return [_md5_key("fact-", fact_text(f)) for f in self.facts]

    @property
    def device(self) -> torch.device:
        return self.passage_emb.device

    @property
    def num_nodes(self) -> int:
        return int(self.adjacency.shape[0])

    def stats(self) -> dict[str, Any]:
        """Index counts (upstream graph_info definitions) plus malformed-input counts, and the
        summary of a solved basis (a base's; a segment version's basis brought current by
        updates, versions/live_basis.py, is reported as none, as its manifest records it)."""
        out: dict[str, Any] = dict(self.counts)
        out["malformed_triples"] = int(self.report.get("malformed_triples", 0))
        out["passages_without_triples"] = int(self.report.get("passages_without_triples", 0))
        out["embedding_dim"] = int(self.passage_emb.shape[1])
        out["encoder"] = self.config.encoder.model
        out["precision"] = self.precision
        solved = self.basis if self.basis is not None and self.basis.updates == 0 else None
        out.update(basis_stats(basis_summary(solved)))
        return out

    @cached_property
    def row_of_key(self) -> KeyRows:
        """Passage key -> passage row (0..P-1) (`get`, `[]`, `in`), built on first use; a
        commit's version inherits it spliced (delta.apply_change), never rebuilt."""
        return KeyRows.of(self.passage_keys)

    @cached_property
    def row_of_phrase(self) -> dict[str, int]:
        """Phrase text -> phrase row (0..M-1), built on first use."""
        return {ph: i for i, ph in enumerate(self.phrases)}

    def passage_row(self, key: str) -> int:
        """Passage row (0..P-1) of a chunk key; KeyError if the key is not indexed."""
        return self.row_of_key[key]

    def to(self, device: str | torch.device, precision: str | None = None) -> Index:
        """This index on `device`, its embeddings at `precision` (default: unchanged); this
        index itself when it is there at that precision already (as `Tensor.to` returns the
        tensor itself), so callers move an index without testing where it is first.

        The precision never depends on the device: float32 stays float32 on CUDA. The basis
        moves with the rest and stays float64 (its certificates are float64 bounds).
        """
        dev = resolve_device(device)
        precision = precision or self.precision
        emb_dtype = precision_dtype(precision)
        if precision == self.precision and _same_device(dev, self.device):
            return self
        moved = replace(
            self,
            adjacency=self.adjacency.to(dev),
            passage_nodes=self.passage_nodes.to(dev),
            fact_phrases=self.fact_phrases.to(dev),
            phrase_passage_counts=self.phrase_passage_counts.to(dev),
            incidence_phrase=self.incidence_phrase.to(dev),
            incidence_passage=self.incidence_passage.to(dev),
            passage_emb=self.passage_emb.to(dev, emb_dtype),
            phrase_emb=self.phrase_emb.to(dev, emb_dtype),
            fact_emb=self.fact_emb.to(dev, emb_dtype),
            basis=self.basis.to(dev) if self.basis is not None else None,
            precision=precision,
        )
        return moved

    def save(self, out_dir: str | Path) -> Path:
        """Write this index to `out_dir` as its new current version, atomically (see
        storage/directory.py).

        Takes the directory's writer lock: a concurrent writer gets WriterLockedError, and so
        does this save while a writable server serves the directory (locks.servers_kept_off:
        the server's next write would undo it).
        """
        with writer_lock(out_dir), servers_kept_off(out_dir):
            write_version(out_dir, *self.payload())
        self.path = Path(out_dir).resolve()
        return self.path

    def payload(self) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]],
                               dict[str, dict[str, Any]], dict[str, Sequence[str]]]:
        """(manifest, tensor groups, tables, string tables): what directory.write_version
        writes.

        Facts are stored as integer rows (fact_phrases + fact_predicate into `predicates`) and
        passage triples as per-passage fact rows (passage_triple_ptr [P + 1],
        passage_triple_fact [T]); texts as string tables (directory.write_version), so loading
        parses no text. The basis, if any, is the group "basis" (PassageBasis.tensors()).
        """
        facts = self.facts if isinstance(self.facts, FactTable) else \
            FactTable.from_triples(self.facts, self.phrases)
        ptr, rows = _passage_triple_rows(self.passage_triples, facts)
        manifest = {
            "hippo_gpu_version": __version__,
            "config": self.config.as_dict(),
            "encoder": {**self.config.encoder.identity(), "dim": int(self.passage_emb.shape[1])},
            "counts": self.counts,
            "openie_report": self.report,
            "build_seconds": self.timings,
            "basis": basis_summary(self.basis),
        }
        tensors = {
            "graph": {
                "adjacency_crow": self.adjacency.crow_indices(),
                "adjacency_col": self.adjacency.col_indices(),
                "adjacency_val": self.adjacency.values(),
                "passage_nodes": self.passage_nodes,
                "fact_phrases": self.fact_phrases,
                "fact_predicate": torch.from_numpy(np.ascontiguousarray(facts.spo[:, 1])),
                "phrase_passage_counts": self.phrase_passage_counts,
                "incidence_phrase": self.incidence_phrase,
                "incidence_passage": self.incidence_passage,
                "synonym_src": self.synonym_src,
                "synonym_dst": self.synonym_dst,
                "synonym_score": self.synonym_score.float(),
                "passage_triple_ptr": torch.from_numpy(ptr),
                "passage_triple_fact": torch.from_numpy(rows),
                "passage_error": torch.tensor(list(self.passage_error), dtype=torch.uint8),
            },
            "embeddings": {
                "passage": self.passage_emb.float(),
                "phrase": self.phrase_emb.float(),
                "fact": self.fact_emb.float(),
            },
        }
        if self.basis is not None:
            tensors["basis"] = self.basis.tensors()
        tables: dict[str, dict[str, Any]] = {"tables": {"passage_malformed": {
            str(i): m for i, m in enumerate(self.passage_malformed) if m}}}
        if self.labels:  # an unlabelled index's files are as they were before labels existed
            tables["tables"]["passage_labels"] = self.labels.to_json()
        strings = {"passage_keys": self.passage_keys, "passage_titles": self.passage_titles,
                   "passage_texts": self.passage_texts, "phrases": self.phrases,
                   "predicates": facts.predicates}
        return manifest, tensors, tables, strings


def _same_device(target: torch.device, current: torch.device) -> bool:
    """Whether tensors on `current` moved to `target` stay where they are, as `Tensor.to`
    decides: a device without an index ("cuda") is the current one of its type."""
    if target.type != current.type:
        return False
    if target.index is None and target.type == "cuda":
        return current.index == torch.cuda.current_device()
    return target.index is None or target.index == current.index


def basis_summary(basis: PassageBasis | None) -> dict[str, Any] | None:
    """What `stats` reports of a basis, as the manifest records it ("basis"; None without one),
    so that directory.manifest_stats reads it without opening basis.safetensors."""
    if basis is None:
        return None
    return {"bytes": basis.nbytes, "seconds": basis.seconds, "steps": basis.steps,
            "damping": basis.damping}


def _passage_triple_rows(passage_triples: Sequence[list[Triple]],
                         facts: FactTable) -> tuple[np.ndarray, np.ndarray]:
    """([P + 1] ptr, [T] fact rows) of per-passage triples (taken as they are when already
    rows over these facts)."""
    if isinstance(passage_triples, PassageTriples) and passage_triples.facts is facts:
        return (np.ascontiguousarray(passage_triples.ptr, dtype=np.int64),
                np.ascontiguousarray(passage_triples.rows, dtype=np.int64))
    row = {f: j for j, f in enumerate(facts)}
    lengths = np.fromiter((len(ts) for ts in passage_triples), dtype=np.int64,
                          count=len(passage_triples))
    try:
        rows = np.fromiter((row[tuple(t)] for ts in passage_triples for t in ts),  # type: ignore
                           dtype=np.int64, count=int(lengths.sum()))
    except KeyError as e:
        raise ValueError(f"passage triple {e.args[0]!r} is not one of the index's facts") from e
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), rows


def index_of_files(path: Path, manifest: dict[str, Any],
                   files: tuple[dict[str, dict[str, torch.Tensor]], dict[str, Any]], *,
                   encoder: str | None = None) -> Index:
    """The Index of a base version's files (directory.read_index_dir), on the CPU in
    float32.

    Args:
        encoder: if given, the encoder the caller intends to query with; a mismatch with the
            encoder the index was built with raises IndexFormatError.
    """
    tensors, tables = files
    try:
        config = IndexConfig.from_dict(manifest["config"])
        g = tensors["graph"]
        e = tensors["embeddings"]
        t = {**tables["tables"], **{k: v for k, v in tables.items() if k != "tables"}}
    except (KeyError, TypeError) as err:
        raise IndexFormatError(f"{path}: incomplete index ({err!r} missing)") from err
    if encoder is not None and encoder != config.encoder.model:
        raise IndexFormatError(
            f"{path}: built with encoder {config.encoder.model!r}, asked to use {encoder!r}; "
            "query vectors of another encoder are not comparable: rebuild the index")
    dim = manifest.get("encoder", {}).get("dim")
    if dim is not None and e["passage"].shape[1] != dim:
        raise IndexFormatError(f"{path}: embeddings have dim {e['passage'].shape[1]}, "
                               f"manifest says {dim}")
    try:
        index = _index_of(Path(path), manifest, config, g, e, t)
        index.basis = basis_of(tensors.get("basis"), index)
    except KeyError as err:
        raise IndexFormatError(f"{path}: incomplete index ({err!r} missing)") from err
    if not isinstance(t["passage_texts"], StringTable):
        raise IndexFormatError(f"{path}: passage texts are not a string table")
    return index


def _index_of(path: Path, manifest: dict[str, Any], config: IndexConfig,
              g: dict[str, torch.Tensor], e: dict[str, torch.Tensor],
              t: dict[str, Any]) -> Index:
    """The Index of one read version: `g` its graph tensors, `e` its embeddings, `t` its
    tables and string tables (directory.read_index_dir). A missing entry raises KeyError."""
    n = int(g["adjacency_crow"].numel() - 1)
    adjacency = make_csr(g["adjacency_crow"], g["adjacency_col"], g["adjacency_val"], n)
    phrases, predicates = t["phrases"], t["predicates"]
    fact_phrases = g["fact_phrases"]
    spo = np.stack([fact_phrases[:, 0].numpy(), g["fact_predicate"].numpy(),
                    fact_phrases[:, 1].numpy()], axis=1).reshape(-1, 3)
    facts = FactTable(phrases, predicates, spo)
    malformed: list[dict[str, int]] = [{} for _ in range(len(t["passage_keys"]))]
    for row, m in t["passage_malformed"].items():
        malformed[int(row)] = m
    return Index(
        config=config,
        adjacency=adjacency,
        passage_nodes=g["passage_nodes"],
        passage_keys=t["passage_keys"],
        passage_titles=t["passage_titles"],
        passage_texts=t["passage_texts"],
        phrases=phrases,
        predicates=predicates,
        facts=facts,
        fact_phrases=fact_phrases,
        phrase_passage_counts=g["phrase_passage_counts"],
        incidence_phrase=g["incidence_phrase"],
        incidence_passage=g["incidence_passage"],
        passage_emb=e["passage"],
        phrase_emb=e["phrase"],
        fact_emb=e["fact"],
        counts=manifest.get("base_counts") or manifest.get("counts", {}),
        report=manifest.get("base_openie_report") or manifest.get("openie_report", {}),
        timings=manifest.get("build_seconds", {}),
        passage_triples=PassageTriples(facts, g["passage_triple_ptr"].numpy(),
                                       g["passage_triple_fact"].numpy()),
        passage_malformed=malformed,
        passage_error=[bool(x) for x in g["passage_error"].tolist()],
        synonym_src=g["synonym_src"],
        synonym_dst=g["synonym_dst"],
        synonym_score=g["synonym_score"],
        path=path,
        version=manifest.get("version"),
        labels=_labels_of(path, t.get("passage_labels")),
    )


def _labels_of(path: Path, data: Any) -> PassageLabels:
    """The base's stored labels (none for a version written without any)."""
    if data is None:
        return PassageLabels()
    try:
        return PassageLabels.from_json(data)
    except ValueError as err:
        raise IndexFormatError(f"{path}: malformed passage labels ({err})") from err


def basis_of(t: dict[str, torch.Tensor] | None, index: Index) -> PassageBasis | None:
    """The stored basis (None for a version without basis.safetensors); its shapes are checked
    against the graph and embeddings it was solved from. A missing entry raises KeyError."""
    if t is None:
        return None
    try:
        basis = PassageBasis.from_tensors(t)
    except (ValueError, TypeError) as err:  # a scalars tensor of another length
        raise IndexFormatError(f"{index.path}: malformed basis ({err})") from err
    p, d = index.passage_emb.shape
    want = {"z": (p, d), "z1": (p,), "h": (index.num_nodes,), "col_bound": (d,),
            "z_norm1": (d,)}
    for name, shape in want.items():
        got = getattr(basis, name)
        if tuple(got.shape) != shape or got.dtype != torch.float64:
            raise IndexFormatError(f"{index.path}: basis tensor {name} is {got.dtype} "
                                   f"{tuple(got.shape)}, expected float64 {shape}")
    return basis


def triple_report(malformed: Sequence[dict[str, int]], error: Sequence[bool],
                  per_passage: np.ndarray) -> dict[str, Any]:
    """An index report's triple counts: per passage its malformed-triple counts by reason, its
    OpenIE error flag and (`per_passage` [P]) its kept triples."""
    by_reason: dict[str, int] = {}
    for m in malformed:
        for reason, count in m.items():
            by_reason[reason] = by_reason.get(reason, 0) + count
    return triple_counts(by_reason, sum(bool(e) for e in error), per_passage)


def triple_counts(by_reason: dict[str, int], with_error: int,
                  per_passage: np.ndarray) -> dict[str, Any]:
    """The report fields of `triple_report` from its sums: malformed triples by reason, the
    passages with an OpenIE error, and the kept triples per passage ([P])."""
    bad = sum(by_reason.values())
    kept = int(per_passage.sum())
    return {
        "passages": len(per_passage),
        "triples_read": kept + bad,
        "triples_kept": kept,
        "malformed_triples": bad,
        "malformed_by_reason": {k: v for k, v in sorted(by_reason.items()) if v},
        "passages_without_triples": int((per_passage == 0).sum()),
        "passages_with_error": with_error,
    }
