"""The index: build it from corpus + OpenIE, save it, load it onto a device.

Indexing (passages -> OpenIE -> graph -> embeddings -> synonym edges) writes an immutable
directory (see store.py). Loading moves it to a device once; search answers batches over it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np
import torch

from hippo_gpu.config import EncoderConfig, GraphConfig, IndexConfig, RetrievalConfig
from hippo_gpu.data import OpenIEReport, Passage, Triple, read_corpus, read_openie
from hippo_gpu.device import resolve_device
from hippo_gpu.embed import Encoder, embeddings_dtype
from hippo_gpu.graph import (
    build_graph,
    extract_elements,
    fact_text,
    make_csr,
    phrase_passage_counts,
)
from hippo_gpu.store import IndexFormatError, read_index_dir, write_index_dir
from hippo_gpu.synonyms import (
    APPROXIMATE_BACKENDS,
    knn,
    knn_recall,
    resolve_knn_backend,
    select_synonym_edges,
    synonym_candidates_k,
)

if TYPE_CHECKING:
    from hippo_gpu.search import FactFilter, Hit

log = logging.getLogger(__name__)

__version__ = "0.1.0"


def _md5_key(prefix: str, text: str) -> str:
    return prefix + hashlib.md5(text.encode("utf-8")).hexdigest()


@dataclass
class Index:
    """A loaded index. Node rows: M phrases, then P passages (N = M + P).

    Shapes: adjacency [N, N] sparse CSR (symmetric, float32); passage_nodes [P];
    fact_phrases [F, 2]; phrase_passage_counts [M]; passage_emb [P, D]; phrase_emb [M, D];
    fact_emb [F, D]; incidence_phrase / incidence_passage [E_p] (phrase row, passage row) pairs.
    """

    config: IndexConfig
    adjacency: torch.Tensor
    passage_nodes: torch.Tensor
    passage_keys: list[str]
    passage_titles: list[str]
    passage_texts: list[str]  # title + "\n" + text, the text that was indexed
    phrases: list[str]
    facts: list[Triple]
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
    path: Path | None = None
    _encoder: Encoder | None = field(default=None, repr=False)
    _row_of_key: dict[str, int] | None = field(default=None, repr=False)
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False)  # per-device solvers

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
        """Index counts (upstream graph_info definitions) plus malformed-input counts."""
        out: dict[str, Any] = dict(self.counts)
        out["malformed_triples"] = int(self.report.get("malformed_triples", 0))
        out["passages_without_triples"] = int(self.report.get("passages_without_triples", 0))
        out["embedding_dim"] = int(self.passage_emb.shape[1])
        out["encoder"] = self.config.encoder.model
        return out

    def passage_row(self, key: str) -> int:
        """Passage row (0..P-1) of a chunk key; KeyError if the key is not indexed."""
        if self._row_of_key is None:
            self._row_of_key = {k: i for i, k in enumerate(self.passage_keys)}
        return self._row_of_key[key]

    def to(self, device: str | torch.device) -> Index:
        """Move tensors to `device` (embeddings become float16 on CUDA, float32 on CPU)."""
        dev = resolve_device(device)
        emb_dtype = embeddings_dtype(dev)
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
            _encoder=None,
            _cache={},
        )
        return moved

    def with_query_encoder(self, *, precision: str | None = None,
                           batch_size: int | None = None) -> Index:
        """The same index with its query encoder run at another precision or batch size.

        The index vectors are untouched; e.g. precision="bfloat16" encodes queries about 3x
        faster on AMX CPUs at a cosine error of ~1e-3 (rankings may change near ties).
        """
        enc = replace(self.config.encoder,
                      precision=precision or self.config.encoder.precision,
                      query_batch_size=batch_size or self.config.encoder.query_batch_size)
        return replace(self, config=replace(self.config, encoder=enc), _encoder=None)

    def encoder(self, cache_dir: str | Path | None = None) -> Encoder:
        """The query encoder (the index's own model), loaded on first use."""
        if self._encoder is None:
            self._encoder = Encoder(self.config.encoder, self.device, cache_dir=cache_dir)
            if self._encoder.dim != self.passage_emb.shape[1]:
                raise IndexFormatError(
                    f"encoder {self.config.encoder.model!r} gives dim {self._encoder.dim}, "
                    f"the index holds dim {self.passage_emb.shape[1]}")
        return self._encoder

    @overload
    def retrieve(self, queries: Sequence[str], *, top_k: int = ..., mode: str = ...,
                 config: RetrievalConfig | None = ..., fact_filter: FactFilter | None = ...,
                 query_entities: Sequence[Sequence[str]] | None = ...,
                 return_seeds: Literal[False] = ...) -> list[list[Hit]]: ...

    @overload
    def retrieve(self, queries: Sequence[str], *, top_k: int = ..., mode: str = ...,
                 config: RetrievalConfig | None = ..., fact_filter: FactFilter | None = ...,
                 query_entities: Sequence[Sequence[str]] | None = ...,
                 return_seeds: Literal[True]) -> tuple[list[list[Hit]], list[list[Triple]]]: ...

    def retrieve(
        self,
        queries: Sequence[str],
        *,
        top_k: int = 200,
        mode: str = "hipporag2",
        config: RetrievalConfig | None = None,
        fact_filter: FactFilter | None = None,
        query_entities: Sequence[Sequence[str]] | None = None,
        return_seeds: bool = False,
    ) -> list[list[Hit]] | tuple[list[list[Hit]], list[list[Triple]]]:
        """Rank passages for a batch of queries; see hippo_gpu.search.retrieve."""
        from hippo_gpu.search import retrieve

        return retrieve(self, queries, top_k=top_k, mode=mode, config=config,
                        fact_filter=fact_filter, query_entities=query_entities,
                        return_seeds=return_seeds)

    def save(self, out_dir: str | Path) -> Path:
        """Write this index to `out_dir` atomically."""
        manifest = {
            "hippo_gpu_version": __version__,
            "config": self.config.as_dict(),
            "encoder": {**self.config.encoder.identity(), "dim": int(self.passage_emb.shape[1])},
            "counts": self.counts,
            "openie_report": self.report,
            "build_seconds": self.timings,
        }
        tensors = {
            "graph": {
                "adjacency_crow": self.adjacency.crow_indices(),
                "adjacency_col": self.adjacency.col_indices(),
                "adjacency_val": self.adjacency.values(),
                "passage_nodes": self.passage_nodes,
                "fact_phrases": self.fact_phrases,
                "phrase_passage_counts": self.phrase_passage_counts,
                "incidence_phrase": self.incidence_phrase,
                "incidence_passage": self.incidence_passage,
            },
            "embeddings": {
                "passage": self.passage_emb.float(),
                "phrase": self.phrase_emb.float(),
                "fact": self.fact_emb.float(),
            },
        }
        tables = {
            "tables": {
                "passage_keys": self.passage_keys,
                "passage_titles": self.passage_titles,
                "passage_texts": self.passage_texts,
                "phrases": self.phrases,
                "facts": [list(f) for f in self.facts],
            }
        }
        path = write_index_dir(out_dir, manifest, tensors, tables)
        self.path = path
        return path


def build_index(
    corpus: str | Path | Sequence[Passage] | Sequence[dict[str, Any]],
    openie: str | Path | dict[str, Any],
    out_dir: str | Path | None = None,
    *,
    encoder: str | EncoderConfig | None = None,
    device: str | torch.device = "auto",
    graph: GraphConfig | None = None,
    cache_dir: str | Path | None = None,
    allow_missing_openie: bool = False,
    show_progress: bool = False,
) -> Index:
    """Build the HippoRAG 2 index of `corpus` from its OpenIE output; save it if `out_dir`.

    Args:
        corpus: corpus JSON path, or passages ({title, text} dicts or Passage objects).
        openie: OpenIE JSON (v1 or v2 format) path or parsed object.
        out_dir: where to write the index (atomically), or None to keep it in memory only.
        encoder: sentence-transformers model name/path, or a full EncoderConfig.
        device: "auto", "cpu", "cuda": where embedding, kNN and the returned index live.
        graph: graph construction settings (defaults reproduce upstream).
        cache_dir: embedding cache root (texts already embedded by the same encoder are reused).
        allow_missing_openie: index corpus passages the OpenIE file lacks with no triples.
    """
    dev = resolve_device(device)
    enc_cfg = encoder if isinstance(encoder, EncoderConfig) else \
        EncoderConfig(model=encoder) if encoder else EncoderConfig()
    config = IndexConfig(encoder=enc_cfg, graph=graph or GraphConfig())
    timings: dict[str, float] = {}
    t = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        timings[name] = round(now - t, 4)
        t = now

    if isinstance(corpus, (str, Path)):
        passages = read_corpus(corpus)
    else:
        passages = [p if isinstance(p, Passage) else read_corpus([p])[0] for p in corpus]
    docs, report = read_openie(openie, passages, allow_missing=allow_missing_openie)
    _log_report(report)
    lap("read")

    elements = extract_elements(docs)
    lap("graph_elements")

    enc = Encoder(enc_cfg, dev, cache_dir=cache_dir)
    lap("load_encoder")
    desc = (lambda s: s) if show_progress else (lambda s: None)
    passage_emb = enc.encode([p.content for p in passages], desc=desc("embed passages"))
    lap("embed_passages")
    phrase_emb = enc.encode(elements.phrases, desc=desc("embed phrases"))
    lap("embed_phrases")
    fact_emb = enc.encode([fact_text(f) for f in elements.facts], desc=desc("embed facts"))
    lap("embed_facts")

    backend = resolve_knn_backend(config.graph.knn_backend, dev)
    k = synonym_candidates_k(config.graph, len(elements.phrases))
    scores, ids = knn(phrase_emb.to(dev) if backend == "torch" else phrase_emb, k, backend=backend)
    lap("synonym_knn")
    knn_info: dict[str, Any] = {"backend": backend, "k": k}
    if backend in APPROXIMATE_BACKENDS:
        knn_info["recall_vs_exact"] = round(knn_recall(phrase_emb, ids), 4)
        log.warning("approximate synonym kNN (%s): recall@%d vs exact = %.4f on a sample",
                    backend, k, knn_info["recall_vs_exact"])
    synonyms = select_synonym_edges(elements.phrases, scores, ids, config.graph)
    graph_out = build_graph(elements, synonyms, config.graph)
    lap("adjacency")

    counts = dict(graph_out.counts)
    counts["synonym_pairs"] = int(len(synonyms.src))
    index = Index(
        config=config,
        adjacency=graph_out.adjacency,
        passage_nodes=graph_out.passage_nodes,
        passage_keys=[p.key for p in passages],
        passage_titles=[p.title for p in passages],
        passage_texts=[p.content for p in passages],
        phrases=elements.phrases,
        facts=elements.facts,
        fact_phrases=torch.from_numpy(elements.fact_phrases),
        phrase_passage_counts=torch.from_numpy(phrase_passage_counts(elements).astype(np.int64)),
        incidence_phrase=torch.from_numpy(elements.passage_phrase_phrase),
        incidence_passage=torch.from_numpy(elements.passage_phrase_passage),
        passage_emb=passage_emb,
        phrase_emb=phrase_emb,
        fact_emb=fact_emb,
        counts=counts,
        report={**report.as_dict(), "synonym_knn": knn_info},
        timings=timings,
        _encoder=enc,  # the query encoder is the build encoder: no second load
    )
    if out_dir is not None:
        index.save(out_dir)
        lap("save")
    index.timings = timings
    return index.to(dev) if dev.type != "cpu" else index


def _log_report(report: OpenIEReport) -> None:
    bad = sum(report.malformed_triples.values())
    if bad:
        log.warning("skipped %d malformed triple(s): %s", bad, dict(report.malformed_triples))
    if report.passages_without_triples:
        log.warning("%d passage(s) have no triples (they become isolated passage nodes)",
                    report.passages_without_triples)
    if report.missing_passages:
        log.warning("%d passage(s) missing from the OpenIE file were indexed without triples",
                    report.missing_passages)


def load_index(
    path: str | Path,
    device: str | torch.device = "auto",
    *,
    encoder: str | None = None,
    verify: bool = True,
) -> Index:
    """Load an index directory onto `device`, verifying checksums and the format version.

    Args:
        encoder: if given, the encoder the caller intends to query with; a mismatch with the
            encoder the index was built with raises IndexFormatError.
    """
    manifest, tensors, tables = read_index_dir(path, verify=verify)
    try:
        config = IndexConfig.from_dict(manifest["config"])
        g = tensors["graph"]
        e = tensors["embeddings"]
        t = tables["tables"]
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
    n = int(g["adjacency_crow"].numel() - 1)
    adjacency = make_csr(g["adjacency_crow"], g["adjacency_col"], g["adjacency_val"], n)
    phrases = t["phrases"]
    facts = [tuple(f) for f in t["facts"]]
    index = Index(
        config=config,
        adjacency=adjacency,
        passage_nodes=g["passage_nodes"],
        passage_keys=t["passage_keys"],
        passage_titles=t["passage_titles"],
        passage_texts=t["passage_texts"],
        phrases=phrases,
        facts=facts,  # type: ignore[arg-type]
        fact_phrases=g["fact_phrases"],
        phrase_passage_counts=g["phrase_passage_counts"],
        incidence_phrase=g["incidence_phrase"],
        incidence_passage=g["incidence_passage"],
        passage_emb=e["passage"],
        phrase_emb=e["phrase"],
        fact_emb=e["fact"],
        counts=manifest.get("counts", {}),
        report=manifest.get("openie_report", {}),
        timings=manifest.get("build_seconds", {}),
        path=Path(path),
    )
    dev = resolve_device(device)
    return index.to(dev) if dev.type != "cpu" else index
