"""build_index(): read -> elements -> encode -> kNN -> graph -> Index [-> save].

The one indexing pipeline: corpus and OpenIE readers (data.py), graph elements and the CSR
adjacency (graph.py), embeddings with their content-addressed cache (embed.py), synonym kNN
(synonyms.py); the result is an `Index` (index.py), written atomically when `out_dir` is given.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hippo_gpu.config import EncoderConfig, GraphConfig, IndexConfig
from hippo_gpu.data import OpenIEReport, Passage, as_passages, read_openie
from hippo_gpu.device import resolve_device
from hippo_gpu.embed import Encoder
from hippo_gpu.graph import build_graph, extract_elements, fact_text, phrase_passage_counts
from hippo_gpu.index import Index
from hippo_gpu.synonyms import (
    APPROXIMATE_BACKENDS,
    knn,
    knn_recall,
    resolve_knn_backend,
    select_synonym_edges,
    synonym_candidates_k,
)

log = logging.getLogger(__name__)

__all__ = ["build_index"]


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

    passages = as_passages(corpus)
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
