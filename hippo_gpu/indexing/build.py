"""build_index(): read -> elements -> encode -> kNN -> graph -> basis -> Index [-> save].

The one indexing pipeline: corpus and OpenIE readers (data.py), graph elements and the CSR
adjacency (indexing/graph.py), embeddings with their content-addressed cache (embed/), synonym edges
(synonyms.synonym_edges, over the kNN of indexing/vector_search.py), the passage basis of the graph
(ppr/basis.py, when IndexConfig.ppr_basis). `assemble_index` computes everything from the
per-passage normalised triples of a corpus; a writer's commit computes the same result from the
previous version and the change instead (hippo_gpu.versions.delta).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hippo_gpu.config import EncoderConfig, GraphConfig, IndexConfig, RetrievalConfig
from hippo_gpu.data import (
    OpenIEDoc,
    OpenIEReport,
    Passage,
    Triple,
    as_passages,
    memoised_normalize,
    read_openie,
)
from hippo_gpu.device import precision_dtype, resolve_device
from hippo_gpu.embed import (
    EmbeddingFunction,
    Encoder,
    PrecomputedEmbeddings,
    hash_encoder_dim,
)
from hippo_gpu.indexing.graph import (
    GraphElements,
    build_graph,
    extract_elements,
    fact_text,
    phrase_passage_counts,
)
from hippo_gpu.indexing.index import Index, triple_report
from hippo_gpu.indexing.labels import PassageLabels
from hippo_gpu.indexing.synonyms import synonym_edges
from hippo_gpu.ppr.basis import PassageBasis, solve_basis
from hippo_gpu.tables import PassageTriples

# Where vectors can come from besides the encoder: a PrecomputedEmbeddings directory (looked up
# by text, the rest encoded) or a function (texts, kind) -> [n, D] used for every text.
EmbeddingSource = PrecomputedEmbeddings | EmbeddingFunction

log = logging.getLogger(__name__)

__all__ = ["CorpusState", "Stages", "assemble_index", "build_index", "corpus_state",
           "solve_index_basis"]


@dataclass
class CorpusState:
    """What an index is computed from: passages and, per passage, its normalised triples (in
    OpenIE order, with multiplicity), malformed-triple counts by reason and OpenIE error flag."""

    passages: list[Passage]
    triples: list[list[Triple]]
    malformed: list[dict[str, int]]
    error: list[bool]
    extra: dict[str, int] = field(default_factory=dict)  # build-time report fields


def corpus_state(passages: Sequence[Passage], docs: Sequence[OpenIEDoc]) -> CorpusState:
    """Normalise each doc's triples (normalising twice changes nothing, so stored triples
    rebuild the same graph). Each distinct string is normalised once and the result shared, so
    a phrase in a thousand triples is one string object, not a thousand."""
    norm = memoised_normalize()

    return CorpusState(
        passages=list(passages),
        triples=[[(norm(s), norm(p), norm(o)) for s, p, o in d.triples] for d in docs],
        malformed=[dict(d.malformed) for d in docs],
        error=[bool(d.error) for d in docs],
    )


class Stages:
    """Seconds per build stage, accumulated by name (`lap` charges the time since the last lap)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self._t, 4)
        self._t = now


def build_index(
    corpus: str | Path | Sequence[Passage] | Sequence[dict[str, Any]],
    openie: str | Path | dict[str, Any],
    out_dir: str | Path | None = None,
    *,
    encoder: str | EncoderConfig | Encoder | None = None,
    device: str | torch.device = "auto",
    graph: GraphConfig | None = None,
    cache_dir: str | Path | None = None,
    allow_missing_openie: bool = False,
    show_progress: bool = False,
    precision: str = "float32",
    embeddings: str | Path | EmbeddingSource | None = None,
    ppr_basis: bool = True,
) -> Index:
    """Build the HippoRAG 2 index of `corpus` from its OpenIE output; save it if `out_dir`.

    Args:
        corpus: corpus JSON path, or passages ({title, text} dicts or Passage objects).
        openie: OpenIE JSON (v1 or v2 format) path or parsed object.
        out_dir: where to write the index (atomically), or None to keep it in memory only.
        encoder: sentence-transformers model name/path ("hash:D": the weightless test encoder of
            embed.HashEncoder), a full EncoderConfig, or a loaded Encoder to reuse. It embeds the
            queries later, so it must be the model that made any `embeddings` given.
        device: "auto", "cpu", "cuda": where embedding, kNN and the returned index live.
        graph: graph construction settings (defaults reproduce upstream).
        cache_dir: embedding cache root (texts already embedded by the same encoder are reused).
        allow_missing_openie: index corpus passages the OpenIE file lacks with no triples.
        show_progress: progress bars for the long stages.
        precision: embedding precision of the returned index on `device` (the saved files are
            float32 whatever it is); see `load_index`.
        embeddings: vectors made elsewhere: a PrecomputedEmbeddings directory (or its path;
            texts it lacks are encoded) or a function (texts, kind) -> [n, D] array used for
            every text (kind: "passages", "phrases" or "facts"). The encoder is then loaded only
            if some text is left to encode.
        ppr_basis: solve and store the passage basis (IndexConfig.ppr_basis; stage "basis").
    """
    dev = resolve_device(device)
    precision_dtype(precision)  # validate before any work
    if isinstance(encoder, Encoder):
        enc_cfg = encoder.config
    else:
        enc_cfg = encoder if isinstance(encoder, EncoderConfig) else \
            EncoderConfig(model=encoder) if encoder else EncoderConfig()
    config = IndexConfig(encoder=enc_cfg, graph=graph or GraphConfig(), ppr_basis=ppr_basis)
    hash_encoder_dim(enc_cfg.model)  # a malformed "hash:" name fails before any work
    source = PrecomputedEmbeddings(embeddings) if isinstance(embeddings, (str, Path)) \
        else embeddings
    stages = Stages()

    passages = as_passages(corpus)
    docs, report = read_openie(openie, passages, allow_missing=allow_missing_openie)
    _log_report(report)
    state = corpus_state(passages, docs)
    state.extra = {"missing_passages": report.missing_passages,
                   "extra_passages": report.extra_passages}
    stages.lap("read")

    def load_encoder() -> Encoder:
        if isinstance(encoder, Encoder):
            return encoder
        enc = Encoder(enc_cfg, dev, cache_dir=cache_dir)
        stages.lap("load_encoder")
        return enc

    del docs, passages  # the state holds what is needed
    index = assemble_index(state, config, load_encoder, dev, stages=stages,
                           show_progress=show_progress, embeddings=source, consume_triples=True)
    if out_dir is not None:
        index.save(out_dir)
        stages.lap("save")
    index.timings = stages.seconds
    return index.to(dev, precision)


def assemble_index(
    state: CorpusState,
    config: IndexConfig,
    load_encoder: Callable[[], Encoder],
    device: torch.device,
    *,
    stages: Stages | None = None,
    show_progress: bool = False,
    embeddings: EmbeddingSource | None = None,
    consume_triples: bool = False,
) -> Index:
    """Compute the index of `state`: graph elements, embeddings, synonym edges, adjacency and
    (with `config.ppr_basis`) the passage basis, solved on `device`.

    With `consume_triples` the per-passage triple lists of `state` are emptied once the graph
    elements hold them as integer rows (9M tuples at 1M passages; build_index owns its state).

    `load_encoder` is called only if some text must be encoded.
    """
    stages = stages or Stages()
    elements = extract_elements(state.triples, normalized=True, show_progress=show_progress)
    per_passage = np.diff(elements.occurrence_ptr)  # [P] triples kept per passage
    if consume_triples:
        state.triples.clear()
    stages.lap("graph_elements")

    vectors = _Vectors(config, load_encoder, stages, embeddings, show_progress)
    emb = _embed_elements(vectors, [p.content for p in state.passages], elements)
    synonyms, knn_info = synonym_edges(elements.phrases, emb.phrases, config.graph, device,
                                       show_progress=show_progress)
    stages.lap("synonym_knn")
    graph_out = build_graph(elements, synonyms, config.graph)
    stages.lap("adjacency")
    basis = None
    if config.ppr_basis:
        basis = solve_index_basis(graph_out.adjacency, graph_out.passage_nodes, emb.passages,
                                  device)
        stages.lap("basis")

    counts = dict(graph_out.counts)
    counts["synonym_pairs"] = int(len(synonyms.src))
    report = {**triple_report(state.malformed, state.error, per_passage), **state.extra,
              "synonym_knn": knn_info}
    return Index(
        config=config,
        adjacency=graph_out.adjacency,
        passage_nodes=graph_out.passage_nodes,
        passage_keys=[p.key for p in state.passages],
        passage_titles=[p.title for p in state.passages],
        passage_texts=emb.passage_texts,
        phrases=elements.phrases,
        predicates=elements.predicates,
        facts=elements.facts,
        fact_phrases=torch.from_numpy(elements.fact_phrases),
        phrase_passage_counts=torch.from_numpy(phrase_passage_counts(elements).astype(np.int64)),
        incidence_phrase=torch.from_numpy(elements.passage_phrase_phrase),
        incidence_passage=torch.from_numpy(elements.passage_phrase_passage),
        passage_emb=emb.passages,
        phrase_emb=emb.phrases,
        fact_emb=emb.facts,
        counts=counts,
        report=report,
        timings=stages.seconds,
        passage_triples=PassageTriples(elements.facts, elements.occurrence_ptr,
                                       elements.occurrence_fact),
        passage_malformed=state.malformed,
        passage_error=state.error,
        synonym_src=torch.from_numpy(synonyms.src.astype(np.int64)),
        synonym_dst=torch.from_numpy(synonyms.dst.astype(np.int64)),
        synonym_score=torch.from_numpy(synonyms.score.astype(np.float32)),
        basis=basis,
        labels=PassageLabels.of(state.passages),
    )


def solve_index_basis(adjacency: torch.Tensor, passage_nodes: torch.Tensor,
                 passage_emb: torch.Tensor, device: torch.device) -> PassageBasis | None:
    """The passage basis at the default damping (queries at another damping iterate), or None
    for a graph without passages."""
    if passage_nodes.numel() == 0:
        return None
    basis = solve_basis(adjacency, passage_nodes, passage_emb,
                        damping=RetrievalConfig().damping, device=device)
    log.info("passage basis: %d float64 PPR solves over %d nodes in %.2f s (<= %d steps each, "
             "%.1f MB)", passage_emb.shape[1] + 1, adjacency.shape[0], basis.seconds,
             basis.steps, basis.nbytes / 1e6)
    return basis


class _Vectors:
    """[n, D] float32 vectors of texts for assemble_index, from a PrecomputedEmbeddings
    directory (looked up by text) or an embedding function (every text); what is left is
    encoded, the encoder loaded on first need. Each call is one stage ("embed_<kind>")."""

    def __init__(self, config: IndexConfig, load_encoder: Callable[[], Encoder], stages: Stages,
                 embeddings: EmbeddingSource | None, show_progress: bool) -> None:
        self.config, self.load_encoder, self.stages = config, load_encoder, stages
        self.embeddings, self.show_progress = embeddings, show_progress
        self._encoder: Encoder | None = None

    def encoder(self) -> Encoder:
        if self._encoder is None:
            self._encoder = self.load_encoder()
        return self._encoder

    def __call__(self, texts: list[str], what: str) -> torch.Tensor:
        """Vectors of `texts` (`what`: "passages", "phrases" or "facts")."""
        if self.embeddings is not None and \
                not isinstance(self.embeddings, PrecomputedEmbeddings):
            out = self._from_function(self.embeddings, texts, what)
        elif isinstance(self.embeddings, PrecomputedEmbeddings):
            out, todo = self._precomputed(self.embeddings, texts, what)
            out = self._encode_rest(texts, what, out, todo)
        else:
            out = self._encode_rest(texts, what, torch.zeros(0), list(range(len(texts))))
        self.stages.lap(f"embed_{what}")
        return out

    @staticmethod
    def _from_function(fn: EmbeddingFunction, texts: list[str], what: str) -> torch.Tensor:
        vectors = np.asarray(fn(texts, what), dtype=np.float32)
        if vectors.ndim != 2 or len(vectors) != len(texts):
            raise ValueError(f"the embedding function returned shape {vectors.shape} for "
                             f"{len(texts)} {what}; expected [{len(texts)}, D]")
        return torch.nn.functional.normalize(torch.from_numpy(vectors), dim=-1)

    def _precomputed(self, source: PrecomputedEmbeddings, texts: list[str],
                     what: str) -> tuple[torch.Tensor, list[int]]:
        found_vectors, found = source.lookup(texts, what)
        todo = np.nonzero(~found)[0].tolist()
        if todo:
            log.warning("%d of %d %s have no precomputed vector: encoding them with %s",
                        len(todo), len(texts), what, self.config.encoder.model)
        return torch.from_numpy(found_vectors), todo

    def _encode_rest(self, texts: list[str], what: str, out: torch.Tensor,
                     todo: list[int]) -> torch.Tensor:
        """`out` with the rows `todo` encoded (all of them: one encode, no scatter)."""
        desc = f"embed {what}" if self.show_progress else None
        if len(todo) == len(texts):  # nothing copied: no gather and scatter of n rows
            return self.encoder().encode(texts, desc=desc)
        if todo:
            fresh = self.encoder().encode([texts[i] for i in todo], desc=desc)
            out[todo] = fresh.float().cpu()
        return out


@dataclass
class _Embedded:
    passage_texts: list[str]
    passages: torch.Tensor  # [P, D]
    phrases: torch.Tensor  # [M, D]
    facts: torch.Tensor  # [F, D]


def _embed_elements(vectors: _Vectors, passage_texts: list[str],
                    elements: GraphElements) -> _Embedded:
    """Vectors of the passages, phrases and facts of `elements`."""
    return _Embedded(passage_texts, vectors(passage_texts, "passages"),
                     vectors(elements.phrases, "phrases"),
                     vectors([fact_text(f) for f in elements.facts], "facts"))


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
