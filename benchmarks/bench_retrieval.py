"""Retrieval benchmark: batched hippo_gpu retrieval vs an upstream-style per-query baseline.

One process, one index (musique_train by default), the same questions for every row:

* ours: ``hippo_gpu.Searcher(index).rank(queries, top_k=200, mode=M)`` for M in hipporag2, dense,
  hybrid, on the Q0 questions (100 for musique_train) and on Q0 x V queries (each question in V
  light deterministic paraphrases, see ``paraphrase``: 1,000 queries by default), all queries in
  one batch, plus a batch-size sweep (default 1, 16, all) on the Q0 questions. End-to-end time is
  the ``rank`` call (Hit objects are not built); the split by stage is ``Ranking.stage_seconds``.
* baseline: upstream's algorithm re-implemented here: HippoRAG 2's query-time steps as the
  official code takes them (§3.3 of the authors' description,
  main@c617143, no recognition-memory filter), written here from that description, one query at
  a time: numpy dot with every fact embedding, min-max, ``argsort`` top-5 facts, phrase weights
  in Python dicts keyed by phrase id (mean of fact score / passages of the phrase), a Python loop
  over every node to zero all but the top-5 phrases, a Python loop over every passage to set
  0.05 x min-max dense score, igraph ``personalized_pagerank(damping=0.5, directed=False,
  weights='weight', implementation='prpack')`` on a graph built once from ``index.adjacency``
  (one undirected edge per pair with weight A[u, v], i.e. the same A as the upstream multigraph),
  and ``argsort`` of the passage scores. Each query is encoded twice (once per instruction; the
  MiniLM instructions are both empty, so the text is the same), in two variants timed side by
  side: ``upstream`` encodes all queries up front, one encoder call per instruction, as upstream's
  ``retrieve()`` does (``get_query_embeddings``), and ``upstream-q1`` encodes each query on its
  own. The benchmark checks that ``upstream`` gives the same top-10 set as our hipporag2 mode on
  >= 95% of the Q0 questions (ties aside) and prints that agreement.

The official package itself runs beside hippo_gpu in benchmarks/bench_official_hipporag2.py;
the baselines here are timed in the same run as ours, and the speed-up columns are baseline
ms/query / row ms/query.

The query encoder of our rows can be changed without rebuilding the index (``--query-batch-size``,
``--query-precision``; the baseline keeps the index's encoder): encoding dominates the batched
pipeline on CPU, and smaller batches (less padding) and bfloat16 autocast make it several times
faster; the recall columns show what that costs.

The encoder is loaded and warmed before anything is timed; the first (cold) call of each mode
(solver construction, allocator warm-up) is reported on its own. Recall (R@2, R@5) is
``hippo_gpu.evaluate.recall_at_k`` against the gold passages of the Q0 original questions (rows
with paraphrases: their original-question part). Each run appends one JSON line to
benchmarks/results/bench_retrieval.jsonl. Run once per thread count:

    python -m benchmarks.bench_retrieval --threads 1
    python -m benchmarks.bench_retrieval --threads 2
    python -m benchmarks.bench_retrieval --threads 1 --device cuda
    python -m benchmarks.bench_retrieval --threads 1 --query-batch-size 16 \
        --query-precision bfloat16
    python -m benchmarks.bench_retrieval --threads 1 --precision bfloat16

Batch sizes are named apart in the results: ``query_batch`` (rows) is the number of queries per
``Searcher.rank`` call; ``batch_sizes.encoder_query_batch_size`` is the query encoder's batch
inside that call (--query-batch-size); ``batch_sizes.encoder_batch_size`` is the passage encoder's
batch the index was built with (not used at query time). ``precision`` is the index embedding
precision of our rows (--precision, default float32; the baseline always uses the float32
embeddings) and ``query_precision`` our query encoder's. A dirty git tree needs --allow-dirty
(see provenance.py).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from benchmarks.common import (
    EMBEDDING_CACHE,
    RESULTS,
    add_arguments,
    append_result_or_exit,
    check_clean_or_exit,
    init_threads,
    limit_threads,
    musique_dir,
    musique_index,
    provenance,
    time_call,
)


def _parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, required=True, help="torch + OpenMP/BLAS threads")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where ours runs")
    ap.add_argument("--index-dir", default="/tmp/mus_index", help="built here if missing")
    ap.add_argument(
        "--data-dir", default=None,
        help="folder with questions.json, corpus.json, openie*.json "
             "(default $HIPPO_DATA_DIR/musique_train, $HIPPO_DATA_DIR default ../shared/data)")
    ap.add_argument("--modes", default="hipporag2,dense,hybrid")
    ap.add_argument("--variants", type=int, default=10, help="paraphrases per question (1..10)")
    ap.add_argument("--batch-sizes", default="1,16,100", help="sweep on the original questions")
    ap.add_argument("--top-k", type=int, default=200)
    ap.add_argument("--precision", choices=["float32", "bfloat16", "float16"],
                    default="float32",
                    help="ours only: index embedding precision (load_index(precision=...)); the "
                         "baseline keeps float32")
    ap.add_argument("--query-batch-size", type=int, default=None,
                    help="ours only: encoder batch size for queries (default: the index's)")
    ap.add_argument("--query-precision", choices=["float32", "bfloat16", "float16"], default=None,
                    help="ours only: encoder precision for queries (default: the index's); the "
                         "baseline keeps the index's encoder")
    ap.add_argument("--repeats", type=int, default=3, help="recorded calls per row")
    ap.add_argument("--max-seconds", type=float, default=8.0, help="recording budget per row")
    ap.add_argument("--baseline-repeats", type=int, default=1,
                    help="recorded passes of the baseline over the questions (after a cold one)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the upstream-style baseline")
    ap.add_argument("--min-agreement", type=float, default=0.95,
                    help="exit 1 if baseline vs hipporag2 top-10 agreement is below this")
    ap.add_argument("--cache-dir", default=None,
                    help="embedding cache for a build (default ~/.cache/hippo_gpu/embeddings)")
    ap.add_argument("--results", default=None,
                    help="JSONL path (default benchmarks/results/bench_retrieval.jsonl)")
    add_arguments(ap)
    return ap.parse_args(argv)


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:  # thread env for OpenMP/BLAS must be set before numpy/torch/igraph load
    init_threads(ARGS.threads)

import hashlib  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from hippo_gpu.data import Question, read_questions  # noqa: E402
from hippo_gpu.evaluate import recall_at_k  # noqa: E402
from hippo_gpu.indexing.index import Index  # noqa: E402
from hippo_gpu.retrieval.options import SearcherOptions  # noqa: E402
from hippo_gpu.retrieval.results import Ranking  # noqa: E402
from hippo_gpu.retrieval.searcher import Searcher  # noqa: E402

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/retrieval", "hippo_gpu/ppr", "hippo_gpu/embed", "kernels/src",
            "hippo_gpu/config.py", "hippo_gpu/device.py", "hippo_gpu/indexing",
            "hippo_gpu/storage", "hippo_gpu/versions", "hippo_gpu/tables.py", "hippo_gpu/data.py",
            "hippo_gpu/evaluate.py")

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
AGREE_K = 10  # top-k compared between the baseline and our hipporag2 mode
RECALL_KS = (2, 5)
STAGES = ("encode", "dense", "facts", "seeds", "ppr", "rank")

# Light paraphrases: variant 0 is the question itself, so the first Q0 rows of the paraphrased
# batch are the original questions (their recall is comparable with the Q0 rows).
_TEMPLATES = (
    lambda q: q,
    lambda q: "Tell me: " + q,
    lambda q: "Question: " + q,
    lambda q: "I want to know: " + q,
    lambda q: q.lower(),
    lambda q: q[:-1].rstrip() if q.endswith("?") else q + "?",
    lambda q: "Please answer: " + q,
    lambda q: q + " Answer briefly.",
    lambda q: "Q: " + q.lower(),
    lambda q: "Could you tell me this: " + q,
)
MAX_VARIANTS = len(_TEMPLATES)


def paraphrase(questions: Sequence[str], variants: int) -> list[str]:
    """Q0 x `variants` queries, variant-major: rows v*Q0 .. (v+1)*Q0-1 hold variant v."""
    if not 1 <= variants <= MAX_VARIANTS:
        raise ValueError(f"variants must be in 1..{MAX_VARIANTS}, got {variants}")
    return [_TEMPLATES[v](q) for v in range(variants) for q in questions]


def _minmax(x: np.ndarray) -> np.ndarray:
    """(x - min) / (max - min); all ones when the range is 0 (upstream misc_utils)."""
    lo, hi = np.min(x), np.max(x)
    if hi - lo == 0:
        return np.ones_like(x)
    return (x - lo) / (hi - lo)


def _phrase_id(phrase: str) -> str:
    return "entity-" + hashlib.md5(phrase.encode("utf-8")).hexdigest()


@dataclass
class BaselineAnswer:
    """One query's baseline output and where it has ties that make the ranking ambiguous."""

    passage_rows: np.ndarray  # [K] passage rows (0..P-1), best first
    scores: np.ndarray  # [K] raw PPR probabilities
    tie_at_fact_cut: bool  # the 5th and 6th fact scores are equal
    tie_at_phrase_cut: bool  # the top_k-th and next phrase weights are equal
    stage_seconds: dict[str, float] = field(default_factory=dict)


class UpstreamBaseline:
    """HippoRAG 2 retrieval, one query at a time, as the official code does it (§3.3).

    Node rows: M phrases, then P passages (the index's order). The graph is built once.
    """

    def __init__(self, index: Index, encoder, *, linking_top_k: int = 5,
                 passage_node_weight: float = 0.05, damping: float = 0.5) -> None:
        import igraph as ig

        self.encoder = encoder
        self.link_k = linking_top_k
        self.passage_node_weight = passage_node_weight
        self.damping = damping
        self.fact_emb = index.fact_emb.float().cpu().numpy()  # [F, D]
        self.passage_emb = index.passage_emb.float().cpu().numpy()  # [P, D]
        self.facts = list(index.facts)
        counts = index.phrase_passage_counts.cpu().tolist()
        passage_nodes = index.passage_nodes.cpu().tolist()
        # dicts keyed by node id ("entity-"/"chunk-" + md5), as upstream's node_name_to_vertex_idx
        self.node_of_key: dict[str, int] = {k: i for i, k in enumerate(index.phrase_keys)}
        self.chunks_of_key: dict[str, int] = dict(zip(index.phrase_keys, counts))
        self.passage_keys = list(index.passage_keys)
        self.node_of_key.update(zip(self.passage_keys, passage_nodes))
        self.passage_node_idxs = [self.node_of_key[k] for k in self.passage_keys]
        self.n = index.num_nodes
        a = index.adjacency.to("cpu").to_sparse_coo().coalesce()
        rows, cols = a.indices()
        vals = a.values().double()
        upper = rows < cols  # A is symmetric: one undirected edge per pair with weight A[u, v]
        if bool((rows == cols).any()):
            raise ValueError("adjacency has self-loops; upstream drops them")
        edges = torch.stack([rows[upper], cols[upper]], dim=1).tolist()
        self.graph = ig.Graph(n=self.n, edges=edges, directed=False)
        self.graph.es["weight"] = vals[upper].tolist()

    def query(self, text: str, top_k: int,
              embeddings: tuple[np.ndarray, np.ndarray] | None = None) -> BaselineAnswer:
        """Rank passages for one query; `embeddings` = (e_fact, e_pass) [D] if encoded already."""
        t = time.perf_counter()
        stage: dict[str, float] = {}

        def lap(name: str) -> None:
            nonlocal t
            now = time.perf_counter()
            stage[name] = now - t
            t = now

        if embeddings is None:
            e_fact = self.encoder.encode_queries([text], "query_to_fact")[0].numpy()  # [D]
            e_pass = self.encoder.encode_queries([text], "query_to_passage")[0].numpy()  # [D]
            lap("encode")
        else:
            e_fact, e_pass = embeddings

        fact_scores = _minmax(np.dot(self.fact_emb, e_fact.T))  # [F]
        order = np.argsort(fact_scores)
        top_facts = order[-self.link_k:][::-1]
        tie_fact = len(order) > self.link_k and \
            fact_scores[order[-self.link_k]] == fact_scores[order[-self.link_k - 1]]
        lap("facts")

        dense = _minmax(np.dot(self.passage_emb, e_pass.T))  # [P]
        dense_order = np.argsort(dense)[::-1]
        dense_sorted = dense[dense_order]
        lap("dense")
        if len(top_facts) == 0:  # no fact kept: the dense ranking is the answer
            k = min(top_k, len(dense_order))
            return BaselineAnswer(dense_order[:k], dense_sorted[:k], False, False, stage)

        phrase_weights = np.zeros(self.n)
        occurs = np.zeros(self.n)
        linked: dict[str, int] = {}
        for j in top_facts:
            fact = self.facts[j]
            score = fact_scores[j]
            for phrase in (fact[0].lower(), fact[2].lower()):
                key = _phrase_id(phrase)
                node = self.node_of_key.get(key)
                if node is None:
                    continue
                weighted = score
                if self.chunks_of_key.get(key, 0) > 0:
                    weighted = weighted / self.chunks_of_key[key]
                phrase_weights[node] += weighted
                occurs[node] += 1
                linked[key] = node
        with np.errstate(invalid="ignore", divide="ignore"):
            phrase_weights = phrase_weights / occurs  # 0/0 -> nan outside the linked phrases
        # top-k phrases; ties by node id (upstream: set order, hash-seed dependent)
        ranked = sorted(linked.items(), key=lambda kv: (-phrase_weights[kv[1]], kv[1]))
        keep = {key for key, _ in ranked[:self.link_k]}
        tie_phrase = len(ranked) > self.link_k and \
            phrase_weights[ranked[self.link_k - 1][1]] == phrase_weights[ranked[self.link_k][1]]
        for key, node in self.node_of_key.items():  # upstream loops over every node
            if key not in keep:
                phrase_weights[node] = 0.0
        passage_weights = np.zeros(self.n)
        dense_sorted = _minmax(dense_sorted)  # upstream normalises the sorted scores again
        for i, row in enumerate(dense_order.tolist()):  # upstream loops over every passage
            node = self.node_of_key[self.passage_keys[row]]
            passage_weights[node] = dense_sorted[i] * self.passage_node_weight
        reset = phrase_weights + passage_weights
        reset = np.where(np.isnan(reset) | (reset < 0), 0.0, reset)
        lap("seeds")

        pr = self.graph.personalized_pagerank(
            vertices=range(self.n), damping=self.damping, directed=False, weights="weight",
            reset=reset, implementation="prpack")
        lap("ppr")
        doc_scores = np.array([pr[i] for i in self.passage_node_idxs])  # [P]
        best = np.argsort(doc_scores)[::-1][:top_k]
        lap("rank")
        return BaselineAnswer(best, doc_scores[best], bool(tie_fact), bool(tie_phrase), stage)


def make_searcher(index: Index, batch_size: int | None, precision: str | None) -> Searcher:
    """A searcher with its query encoder's batch size / precision overridden (same tensors)."""
    return Searcher(index, options=SearcherOptions(query_precision=precision,
                                                   query_batch_size=batch_size))


def _recall(keys: list[list[str]], gold: list[set[str]]) -> dict[str, float]:
    return recall_at_k(keys, gold, RECALL_KS)


def _per_query_ms(stage_sums: list[dict[str, float]], q: int) -> dict[str, float]:
    """Mean over recorded calls of each stage's seconds, as ms per query."""
    out: dict[str, float] = {}
    for sums in stage_sums:
        for k, v in sums.items():
            out[k] = out.get(k, 0.0) + v
    return {k: v * 1e3 / q / max(len(stage_sums), 1) for k, v in out.items()}


def run_ours(searcher: Searcher, queries: list[str], mode: str, batch: int,
             args: argparse.Namespace, gold: list[set[str]],
             q0: int) -> tuple[dict, torch.Tensor]:
    """Time one (mode, Q, batch) row; return it and the passage rows [Q0, K] of the Q0 originals."""
    dev = searcher.device
    calls: list[dict[str, float]] = []
    holder: dict[str, list[Ranking]] = {}

    def run() -> None:
        stage: dict[str, float] = {}
        out = []
        for i in range(0, len(queries), batch):
            r = searcher.rank(queries[i:i + batch], top_k=args.top_k, mode=mode)
            for k, v in r.stage_seconds.items():
                stage[k] = stage.get(k, 0.0) + v
            out.append(r)
        calls.append(stage)
        holder["rankings"] = out

    timing = time_call(run, device=dev, warmup=0, repeats=args.repeats,
                       max_seconds=args.max_seconds)
    q = len(queries)
    rows = torch.cat([r.passage_rows.cpu() for r in holder["rankings"]])  # [Q, K]
    keys = searcher.index.passage_keys
    ranked = [[keys[j] for j in row] for row in rows[:q0].tolist()]
    row = {
        "pipeline": "hippo_gpu", "mode": mode, "device": str(dev), "Q": q, "query_batch": batch,
        "precision": searcher.index.precision,
        "query_precision": searcher.encoder_config.precision,
        "ms_per_query": timing.median * 1e3 / q,
        "p20_ms_per_query": timing.p20 * 1e3 / q,
        "p80_ms_per_query": timing.p80 * 1e3 / q,
        "queries_per_s": q / timing.median,
        "first_pass_ms": timing.first * 1e3,  # first pass over Q, not in the median
        "runs": timing.runs,
        "recall": _recall(ranked, gold),
        "stage_ms_per_query": _per_query_ms(calls[1:] or calls, q),  # calls[0] is the cold one
    }
    if q > q0:  # every paraphrase scored against its question's gold passages
        all_keys = [[keys[j] for j in r] for r in rows.tolist()]
        row["recall_all_variants"] = _recall(all_keys, gold * (q // q0))
    return row, rows[:q0]


def run_baseline(base: UpstreamBaseline, texts: list[str], gold: list[set[str]],
                 args: argparse.Namespace, *, batched_encode: bool) -> tuple[dict, list]:
    """Time the baseline over `texts`, one query at a time after the query encoding.

    batched_encode=True encodes all queries up front, one encoder call per instruction, as
    upstream's retrieve() does (get_query_embeddings); False encodes each query on its own.
    """
    holder: dict[str, list[BaselineAnswer]] = {}
    per_query: list[float] = []
    encode_s: list[float] = []

    def run() -> None:
        answers = []
        per_query.clear()
        start = time.perf_counter()
        if batched_encode:  # [Q, D] each
            e_fact = base.encoder.encode_queries(texts, "query_to_fact").numpy()
            e_pass = base.encoder.encode_queries(texts, "query_to_passage").numpy()
        encode_s.append(time.perf_counter() - start)
        for i, text in enumerate(texts):
            start = time.perf_counter()
            emb = (e_fact[i], e_pass[i]) if batched_encode else None
            answers.append(base.query(text, args.top_k, emb))
            per_query.append(time.perf_counter() - start)
        holder["answers"] = answers

    timing = time_call(run, warmup=0, repeats=args.baseline_repeats)
    answers = holder["answers"]
    q = len(texts)
    stage: dict[str, float] = {"encode": encode_s[-1]} if batched_encode else {}
    for a in answers:
        for k, v in a.stage_seconds.items():
            stage[k] = stage.get(k, 0.0) + v
    keys = base.passage_keys
    row = {
        "pipeline": "upstream" if batched_encode else "upstream-q1", "mode": "hipporag2",
        "device": str(base.encoder.device), "Q": q, "query_batch": 1,
        "precision": "float32", "query_precision": base.encoder.config.precision,
        "ms_per_query": timing.median * 1e3 / q,
        "p20_ms_per_query": timing.p20 * 1e3 / q,
        "p80_ms_per_query": timing.p80 * 1e3 / q,
        "median_query_ms": float(np.median(per_query)) * 1e3,  # after the up-front encoding
        "queries_per_s": q / timing.median,
        "first_pass_ms": timing.first * 1e3,  # first pass over Q, not in the median
        "runs": timing.runs,
        "recall": _recall([[keys[j] for j in a.passage_rows.tolist()] for a in answers], gold),
        "stage_ms_per_query": {k: v * 1e3 / q for k, v in stage.items()},
    }
    return row, answers


def agreement(ours: torch.Tensor, answers: list[BaselineAnswer]) -> dict:
    """Top-10 agreement of our hipporag2 passage rows [Q0, K] and the baseline's, per question."""
    ours_rows = ours[:, :AGREE_K].tolist()
    same_set, same_order, differ = 0, 0, []
    for qi, (mine, theirs) in enumerate(zip(ours_rows, answers)):
        ref = theirs.passage_rows[:AGREE_K].tolist()
        same_set += set(mine) == set(ref)
        same_order += mine == ref
        if set(mine) != set(ref):
            s = theirs.scores
            near = len(s) > AGREE_K and abs(s[AGREE_K - 1] - s[AGREE_K]) <= 1e-6 * abs(s[0])
            differ.append({"question": qi, "tie_at_fact_cut": theirs.tie_at_fact_cut,
                           "tie_at_phrase_cut": theirs.tie_at_phrase_cut,
                           "near_tie_at_rank_10": bool(near)})
    n = max(len(answers), 1)
    return {"top10_set": same_set / n, "top10_order": same_order / n, "questions": len(answers),
            "disagreements": differ}


def print_table(rows: list[dict]) -> None:
    head = (f"{'pipeline':<11} {'mode':<10} {'Q':>5} {'qbatch':>6} {'ms/query':>9} {'q/s':>8} "
            f"{'x up':>6} {'x up-q1':>7} {'R@2':>6} {'R@5':>6} | "
            + " ".join(f"{s:>7}" for s in STAGES))
    print("\n" + head)
    print("-" * len(head))
    for r in rows:
        sp = r["speedup_vs_baseline"] or float("nan")
        sp1 = r["speedup_vs_baseline_q1"] or float("nan")
        st = r["stage_ms_per_query"]
        print(f"{r['pipeline']:<11} {r['mode']:<10} {r['Q']:>5} {r['query_batch']:>6} "
              f"{r['ms_per_query']:>9.3f} {r['queries_per_s']:>8.1f} {sp:>6.1f} {sp1:>7.1f} "
              f"{r['recall']['2']:>6.2f} {r['recall']['5']:>6.2f} | "
              + " ".join(f"{st[s]:>7.3f}" if s in st else f"{'-':>7}" for s in STAGES))
    print("stages: ms per query (mean over recorded calls). x up / x up-q1: ms/query of the "
          "upstream-style baseline with queries encoded up front (as upstream retrieve()) / "
          "one query at a time, divided by the row's ms/query; qbatch: queries per rank call")


def main(args: argparse.Namespace, index: Index | None = None) -> dict:
    """Run the benchmark; `index` is an already loaded float32 CPU index (else --index-dir)."""
    git = check_clean_or_exit(args.allow_dirty)  # before minutes of measurement, not after
    limit_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available")
    data = musique_dir(args.data_dir, need=("questions.json",))
    questions: list[Question] = read_questions(data / "questions.json")
    texts = [q.question for q in questions]
    gold = [{p.key for p in q.gold} for q in questions]
    q0 = len(texts)
    queries = paraphrase(texts, args.variants)
    modes = [m for m in args.modes.split(",") if m]
    if not set(modes) <= {"hipporag2", "dense", "hybrid"}:
        raise SystemExit(f"--modes: choose from hipporag2, dense, hybrid (got {args.modes!r}; "
                         "hipporag1 needs query entities, which this benchmark does not have)")
    sweep = sorted({min(int(b), q0) for b in args.batch_sizes.split(",") if b} | {q0})

    start = time.perf_counter()
    cpu_index = index if index is not None else musique_index(
        data, args.index_dir, cache_dir=Path(args.cache_dir) if args.cache_dir else EMBEDDING_CACHE)
    load_s = time.perf_counter() - start
    # ours at --precision on --device; the baseline reads the float32 CPU embeddings
    index = cpu_index.to(args.device, args.precision)
    base_index = index
    searcher = make_searcher(index, args.query_batch_size, args.query_precision)
    start = time.perf_counter()
    enc = searcher.encoder
    encoder_load_s = time.perf_counter() - start
    start = time.perf_counter()
    enc.encode_queries(texts[:1], "query_to_passage")
    encoder_first_ms = (time.perf_counter() - start) * 1e3
    stats = index.stats()
    nnz = int(index.adjacency.values().numel())
    print(f"index={args.index_dir} N={index.num_nodes} P={len(index.passage_keys)} "
          f"F={len(index.facts)} nnz={nnz} Q0={q0} Q={len(queries)} device={index.device} "
          f"precision={index.precision} query_precision={searcher.encoder_config.precision} "
          f"encoder_query_batch_size={searcher.encoder_config.query_batch_size} "
          f"threads={args.threads} torch_threads={torch.get_num_threads()} "
          f"loadavg={' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"index load {load_s:.2f}s, encoder load {encoder_load_s:.2f}s, "
          f"first encode {encoder_first_ms:.1f} ms (all excluded from the rows)")

    first_call: dict[str, float] = {}
    for mode in modes:  # cold call of each mode: solver build, allocator warm-up
        def one(mode: str = mode) -> Ranking:
            return searcher.rank(texts[:1], top_k=args.top_k, mode=mode)

        t = time_call(one, device=index.device, warmup=0, repeats=1)
        first_call[mode] = t.first * 1e3
        print(f"  first call {mode:<10} {first_call[mode]:9.1f} ms (1 query, cold)")

    shapes = [(q0, b) for b in sweep]  # (Q, batch size)
    if len(queries) > q0:
        shapes.append((len(queries), len(queries)))
    rows: list[dict] = []
    ours_h2: torch.Tensor | None = None
    for mode in modes:
        for q, b in shapes:
            row, ranked = run_ours(searcher, queries[:q], mode, b, args, gold, q0)
            rows.append(row)
            if mode == "hipporag2" and q == q0 and b == q0:
                ours_h2 = ranked
            print(f"  {mode:<10} Q={q:<5} query_batch={b:<5} {row['ms_per_query']:9.3f} ms/q "
                  f"R@5={row['recall']['5']:.2f} runs={row['runs']}")

    base_rows: list[dict] = []
    agree = None
    if not args.no_baseline:
        start = time.perf_counter()
        base = UpstreamBaseline(cpu_index, Searcher(base_index).encoder)  # the index's encoder
        graph_s = time.perf_counter() - start
        for batched in (True, False):
            brow, answers = run_baseline(base, texts, gold, args, batched_encode=batched)
            brow["graph_build_s"] = round(graph_s, 3)
            base_rows.append(brow)
            print(f"  {brow['pipeline']:<10} Q={q0:<5} query_batch=1     "
                  f"{brow['ms_per_query']:9.3f} "
                  f"ms/q (median query {brow['median_query_ms']:.2f} ms after encoding, "
                  f"igraph build {graph_s:.2f}s)")
            if batched and ours_h2 is not None:
                agree = agreement(ours_h2, answers)
    rows = base_rows + rows
    for r in rows:
        for key, ref in zip(("speedup_vs_baseline", "speedup_vs_baseline_q1"), base_rows):
            r[key] = round(ref["ms_per_query"] / r["ms_per_query"], 2)
        for key in ("speedup_vs_baseline", "speedup_vs_baseline_q1")[len(base_rows):]:
            r[key] = None
    print_table(rows)
    for ref in base_rows:
        print(f"{ref['pipeline']} stages (ms/query): "
              + ", ".join(f"{k} {v:.2f}" for k, v in ref["stage_ms_per_query"].items()))
    if base_rows:
        print("the official package itself: python -m benchmarks.bench_official_hipporag2")
    if agree is not None:
        d = agree["disagreements"]
        ties = sum(x["tie_at_fact_cut"] or x["tie_at_phrase_cut"] or x["near_tie_at_rank_10"]
                   for x in d)
        verdict = "ok" if agree["top10_set"] >= args.min_agreement else "BELOW"
        print(f"top-10 agreement baseline vs hipporag2: set {agree['top10_set']:.3f} "
              f"(>= {args.min_agreement}: {verdict}), order {agree['top10_order']:.3f}; "
              f"{len(d)} differ, {ties} of them with a tie at a cut")

    enc = searcher.encoder_config
    record = {
        **provenance(
            "retrieval", threads=args.threads, device=args.device,
            encoder_backend=searcher.encoder.backend, precision=index.precision,
            query_precision=enc.precision,
            batch_sizes={"query_batch": sweep, "encoder_query_batch_size": enc.query_batch_size,
                         "encoder_batch_size": index.config.encoder.batch_size},
            optional_versions=("scipy", "igraph", "sentence_transformers", "hippo_gpu"),
            git=git),
        "index": {"path": str(args.index_dir), "N": index.num_nodes, "nnz": nnz, **stats},
        "data": str(data),
        "Q0": q0,
        "Q": len(queries),
        "variants": args.variants,
        "top_k": args.top_k,
        "baseline": {"precision": "float32", "query_precision": index.config.encoder.precision,
                     "encoder_query_batch_size": index.config.encoder.query_batch_size},
        "index_load_s": round(load_s, 3),
        "encoder_load_s": round(encoder_load_s, 3),
        "encoder_first_ms": round(encoder_first_ms, 2),
        "first_call_ms": first_call,
        "official_ms_per_query_1_thread": 79.7,
        "agreement": agree,
        "rows": rows,
    }
    path = Path(args.results) if args.results else RESULTS / "bench_retrieval.jsonl"
    append_result_or_exit(path, record, allow_dirty=args.allow_dirty)
    print(f"appended to {path} (commit {record['commit']}, dirty {record['dirty']})")
    if agree is not None and agree["top10_set"] < args.min_agreement:
        raise SystemExit(1)
    return record


if __name__ == "__main__" and ARGS is not None:
    main(ARGS)
