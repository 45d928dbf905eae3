"""Recall of the legacy HippoRAG 1 mode (hippo_gpu.retrieval.hipporag1) on musique_train and the
sample.

Query entities are capitalised spans of each question
(hippo_gpu.retrieval.entities.heuristic_entities): no LLM NER runs here, and neither musique_train
nor the bundled sample ships a query-NER file. Rows, all on the same index, entities and questions:

* searcher        ``evaluate_mode(Searcher(index), questions, "hipporag1", query_entities=...)``:
                  the mode as shipped, D' (passage-fact incidence derived from the index).
* exact D         the same pipeline with the legacy graph rebuilt from the OpenIE file
                  (``hipporag1.build_v1_graph(index, openie_docs=...)``: the exact passage-fact
                  incidence and v1's count of repeated triples), ties by lower row.
* exact D, v1 ties  as above, but tied passages in descending row order, as v1's
                  ``np.argsort(kind='mergesort')[::-1]`` leaves them: the closest to legacy v1.
* sample          the bundled sample (30 passages, 4 questions): searcher and exact D rows.

Recall@k = |top-k ∩ gold| / |gold| averaged over questions (hippo_gpu.evaluate). Appends one JSON
line to benchmarks/results/hipporag1_recall.jsonl (provenance.py fields, plus the entity source,
recall per row, question counts and the v1 graph's provenance). Exits 2 printing SKIP when the
musique_train data is missing. A dirty tree needs --allow-dirty.

    python -m benchmarks.eval_hipporag1 --threads 2 [--allow-dirty]
"""

from __future__ import annotations

import argparse
import sys

from benchmarks.common import (
    EMBEDDING_CACHE,
    MUSIQUE_OPENIE,
    RESULTS,
    DirtyTreeError,
    add_arguments,
    append_result,
    check_clean,
    init_threads,
    musique_dir,
    musique_index,
    provenance,
)

KS = (1, 2, 5, 10)


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, default=2, help="torch + OpenMP/BLAS threads")
    ap.add_argument("--data-dir", default=None,
                    help="musique_train folder (default $HIPPO_DATA_DIR/musique_train, "
                         "$HIPPO_DATA_DIR default ../shared/data)")
    ap.add_argument("--index-dir", default="/tmp/musique_idx", help="built here if missing")
    ap.add_argument("--out", default=str(RESULTS / "hipporag1_recall.jsonl"))
    add_arguments(ap)
    return ap.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
    init_threads(ARGS.threads)

import torch  # noqa: E402

from hippo_gpu import Searcher, SearcherOptions, build_index  # noqa: E402
from hippo_gpu.config import RetrievalConfig  # noqa: E402
from hippo_gpu.data import as_passages, read_openie, read_questions  # noqa: E402
from hippo_gpu.evaluate import evaluate_mode, recall_at_k  # noqa: E402
from hippo_gpu.retrieval import hipporag1 as v1  # noqa: E402
from hippo_gpu.retrieval.entities import heuristic_entities  # noqa: E402
from hippo_gpu.retrieval.solvers import build_solver  # noqa: E402
from hippo_gpu.sample import paths as sample_paths  # noqa: E402

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/retrieval", "hippo_gpu/ppr", "hippo_gpu/embed", "kernels/src",
            "hippo_gpu/config.py", "hippo_gpu/device.py", "hippo_gpu/indexing",
            "hippo_gpu/storage", "hippo_gpu/versions", "hippo_gpu/tables.py", "hippo_gpu/data.py",
            "hippo_gpu/evaluate.py")


def _recall(r: dict[str, float]) -> dict[str, float]:
    return {k: r[k] for k in map(str, KS)}


def _rank_v1(searcher: Searcher, graph: v1.V1Graph, entities: list[list[str]],
             cfg: RetrievalConfig, *, legacy_ties: bool) -> list[list[int]]:
    """Full passage rankings by the hipporag1 functions, ties by lower or (v1) higher row."""
    index = searcher.index
    texts, owner = v1.flatten_entities(entities)
    rows = v1.link_entities(searcher.encoder.encode(texts), index.phrase_emb)
    scores, _, _ = v1.passage_scores(graph, build_solver(graph.adjacency, cfg.ppr), rows,
                                  torch.tensor(owner, dtype=torch.int64), len(entities))
    p = scores.shape[1]
    # lexicographic sort: row order (asc, or desc for v1), then score desc, stably
    base = torch.arange(p - 1, -1, -1) if legacy_ties else torch.arange(p)
    s = scores.index_select(1, base)
    order = torch.sort(s, dim=1, descending=True, stable=True).indices
    return base[order].tolist()


def main(args: argparse.Namespace) -> int:
    data = musique_dir(args.data_dir, need=("corpus.json", "questions.json", MUSIQUE_OPENIE))
    openie = data / MUSIQUE_OPENIE
    try:
        git = check_clean(args.allow_dirty)
    except DirtyTreeError as e:
        print(e)
        return 2
    cache = EMBEDDING_CACHE
    index = musique_index(data, args.index_dir, cache_dir=cache)
    questions = read_questions(data / "questions.json")
    ents = heuristic_entities([q.question for q in questions])
    gold = [{p.key for p in q.gold} for q in questions]
    cfg = RetrievalConfig()
    searcher = Searcher(index, options=SearcherOptions(cache_dir=cache))

    rows: dict[str, dict[str, float]] = {}
    res = evaluate_mode(searcher, questions, "hipporag1", query_entities=ents)
    rows["musique searcher (derived D)"] = _recall(res.recall)
    graph = searcher.entities.v1_graph  # the searcher's own v1 structures, for provenance
    assert graph is not None

    docs, _ = read_openie(openie, as_passages(data / "corpus.json"))
    exact_pairs = v1.passage_facts_from_openie(index, docs)
    derived_pairs = v1.derived_passage_facts(index)
    exact = v1.build_v1_graph(index, openie_docs=docs)
    keys = index.passage_keys
    for name, legacy in (("musique exact D", False), ("musique exact D, v1 ties", True)):
        ranked = _rank_v1(searcher, exact, ents, cfg, legacy_ties=legacy)
        rows[name] = _recall(recall_at_k([[keys[j] for j in r] for r in ranked], gold, KS))

    files = sample_paths()
    s_index = build_index(files["corpus"], files["openie"], None, device="cpu", cache_dir=cache)
    s_questions = read_questions(files["questions"])
    s_ents = heuristic_entities([q.question for q in s_questions])
    s_searcher = Searcher(s_index, options=SearcherOptions(cache_dir=cache))
    s_res = evaluate_mode(s_searcher, s_questions, "hipporag1", query_entities=s_ents)
    rows["sample searcher (derived D)"] = _recall(s_res.recall)
    s_docs, _ = read_openie(files["openie"], as_passages(files["corpus"]))
    s_exact = v1.build_v1_graph(s_index, openie_docs=s_docs)
    s_ranked = _rank_v1(s_searcher, s_exact, s_ents, cfg, legacy_ties=False)
    s_gold = [{p.key for p in q.gold} for q in s_questions]
    rows["sample exact D"] = _recall(recall_at_k(
        [[s_index.passage_keys[j] for j in r] for r in s_ranked], s_gold, KS))

    print(f"hipporag1 recall, entities: capitalised spans; damping {cfg.damping}; "
          f"{len(questions)} musique_train / {len(s_questions)} sample questions")
    print(f"{'row':32s}" + "".join(f"{'R@' + str(k):>8s}" for k in KS))
    for name, r in rows.items():
        print(f"{name:32s}" + "".join(f"{r[str(k)]:8.2f}" for k in KS))
    n_exact, n_derived = len(exact_pairs[0]), len(derived_pairs[0])
    print(f"v1 graph: weights {graph.weights}, synonym assignments {graph.synonym_pairs}, "
          f"W nnz {graph.adjacency._nnz()}; passage-fact pairs: exact {n_exact}, derived "
          f"{n_derived}; musique stage seconds (first call, 100 queries): "
          + ", ".join(f"{k} {v:.2f}" for k, v in res.stage_s.items()))

    record = provenance("hipporag1_recall", threads=args.threads, device="cpu",
                        encoder_backend=searcher.encoder.backend,
                        query_precision=searcher.encoder_config.precision,
                        batch_sizes={"query_batch": len(questions)}, git=git)
    record.update({
        "cpu_model": record["hardware"]["cpu"],
        "entities": "heuristic_entities (capitalised spans of the question)",
        "damping": cfg.damping,
        "n_questions": {"musique_train": len(questions), "sample": len(s_questions)},
        "recall": rows,
        "v1_graph": {"weights": graph.weights, "synonym_pairs": graph.synonym_pairs,
                     "phrase_edges_nnz": int(graph.adjacency._nnz()),
                     "passage_fact_pairs_exact": n_exact,
                     "passage_fact_pairs_derived": n_derived},
        "stage_s_first_call": {k: round(v, 4) for k, v in res.stage_s.items()},
    })
    out = append_result(args.out, record, allow_dirty=args.allow_dirty)
    print(f"appended to {out}")
    return 0


if __name__ == "__main__" and ARGS is not None:
    sys.exit(main(ARGS))
