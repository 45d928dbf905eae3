"""Continual indexing on musique_train: insert and delete against a build, in one run.

    python -m benchmarks.bench_continual --threads 2 [--stream 100] [--allow-dirty]
    python -m benchmarks.bench_continual --threads 1 --synthetic 100000 --stream 1000
    python -m benchmarks.bench_continual --threads 1 --synthetic 1000000 --repeat 10
        --phases insert,delete --work DIR   (one command: at 1M what fits in 24 GiB; DIR keeps
        the base for the next run)

(The second form: one change's cost as the index grows, on a synthetic corpus; see
benchmarks/continual_synthetic.py. The rest of this docstring is the first form.)

(a) build the index of the first 90 % of corpus.json from an EMPTY embedding cache (a fresh
    temporary cache: a user's first build, every text embedded);
(b) insert the last 10 % with an IndexWriter (its own encoder, the cache (a) filled: the new
    passages' texts are embedded, the old ones' vectors are copied from the index);
(c) delete those passages again (a fresh writer, as a separate `hippo-gpu delete` would);
    insert/build and delete/build wall-time ratios (targets: <= 25 % and <= 10 %) with the stage
    breakdown of each;
(d) the counts of (b) against a full build of the whole corpus (made from the now-warm cache; its
    time is not a denominator), the indexes compared by name (benchmarks/soak.py's
    index_differences: counts, edges and weights and synonym pairs by phrase text and passage
    key), and hipporag2 Recall@k, identical top-10 and the top-10 up to certified ties
    (continual_synthetic.rankings_vs_build: differences beyond the two solves' bounds, must be
    0) on the first 100 questions;
(e) a stream of `--stream` single-passage inserts that ends at the whole corpus: a base of all
    but the last `--stream` passages (built from the warm cache), then one writer, one commit per
    passage, no embedding cache (each passage's texts are really encoded), no compaction until
    the end: ms per insert p50/p99 and the stage breakdown of the median one, the chain's cold
    load, then the compaction and the compacted index against (d)'s full build (counts, the
    comparison by name, hipporag2 recall, top-10 agreement and certified ties). `--stream 1000`
    is issue 23's musique check (a base of 890 passages).

The Python import of sentence-transformers (paid once per process by any command) is measured
apart and included in neither the build nor the insert; the encoder's model load is included in
both ((a) and (b) each load their own). Each run appends one JSON line to
benchmarks/results/bench_continual.jsonl with provenance.py's fields (commit, dirty flag, CPU
model, threads, versions); a dirty tree needs --allow-dirty.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from benchmarks.common import (
    RESULTS,
    add_arguments,
    append_result_or_exit,
    check_clean_or_exit,
    cpu_model,
    init_threads,
    musique_dir,
    musique_openie,
    provenance,
    quantile,
)


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, required=True, help="torch + faiss threads")
    ap.add_argument("--stream", type=int, default=100,
                    help="single-passage inserts in (e): the corpus's last ones")
    ap.add_argument("--questions", type=int, default=100, help="questions for recall in (d)")
    ap.add_argument("--holdout", type=float, default=0.1, help="fraction inserted in (b)")
    ap.add_argument("--data-dir", default=None, help="default $HIPPO_DATA_DIR or ../shared/data")
    ap.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--results", default=None)
    ap.add_argument("--synthetic", type=int, default=None, metavar="N",
                    help="run benchmarks/continual_synthetic.py on N synthetic passages instead")
    ap.add_argument("--repeat", type=int, default=20,
                    help="--synthetic: single inserts and single deletes timed")
    ap.add_argument("--probe", type=int, default=250,
                    help="--synthetic: measure load and query cost every this many commits "
                    "(0: never)")
    ap.add_argument("--no-cold-load", action="store_true",
                    help="--synthetic: probes time the query batch only, no cold load (at 1M a "
                    "second loaded copy beside the writer does not fit in 24 GiB)")
    ap.add_argument("--seed", type=int, default=0, help="--synthetic: corpus seed")
    ap.add_argument("--phases", default="insert,delete,stream,compact,compare",
                    help="--synthetic: which of (b)-(f) run (insert always; at 1M: "
                    "insert,delete)")
    ap.add_argument("--exact-synonyms", action="store_true",
                    help="--synthetic: build with the exact torch synonym kNN (equality check)")
    add_arguments(ap)
    return ap.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    init_threads(ARGS.threads)

import json  # noqa: E402
import resource  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/versions", "hippo_gpu/indexing", "hippo_gpu/storage", "hippo_gpu/embed",
            "hippo_gpu/ppr", "kernels/src", "hippo_gpu/config.py", "hippo_gpu/device.py",
            "hippo_gpu/tables.py", "hippo_gpu/retrieval", "hippo_gpu/synthetic.py",
            "hippo_gpu/data.py", "hippo_gpu/evaluate.py")

TARGETS = {"insert": 0.25, "delete": 0.10}


def _stage_table(title: str, stages: dict[str, float], total: float) -> None:
    print(f"\n{title}: {total:.2f} s wall")
    print(f"  {'stage':<22}{'seconds':>10}")
    for k, v in stages.items():
        print(f"  {k:<22}{v:>10.3f}")
    rest = total - sum(stages.values())
    print(f"  {'(unstaged)':<22}{rest:>10.3f}")


def _adjacency_diff(a: Any, b: Any) -> dict[str, Any]:
    """Two indexes compared by name (benchmarks/soak.py, index_differences): phrases, passages,
    edges and weights by phrase text and passage key, never by row."""
    from benchmarks.soak import index_differences

    out = index_differences(a, b)
    out.update(same_phrases=a.phrases == b.phrases, same_facts=a.facts == b.facts,
               same_passages=a.passage_keys == b.passage_keys)
    return out


def _writer_phase(index_dir: Path, device: str, cache_dir: Path | None,
                  change: Any) -> tuple[float, dict[str, float], Any, Any]:
    """Open a writer, stage `change(w)`, commit, close: (wall s, stages, report, new index)."""
    from hippo_gpu.versions.writer import IndexWriter

    start = time.perf_counter()
    w = IndexWriter(index_dir, device=device, cache_dir=cache_dir)
    w.open()
    opened = time.perf_counter()
    change(w)
    staged = time.perf_counter()
    index = w.commit()
    report = w.last_change
    committed = time.perf_counter()
    w.close()
    total = time.perf_counter() - start
    stages = {"open (load + gc)": round(opened - start, 4),
              "stage (read input)": round(staged - opened, 4),
              **{f"commit: {k}": v for k, v in report.stage_seconds.items()},
              "commit: manifest + diff": round(committed - staged - sum(
                  report.stage_seconds.values()), 4)}
    return total, stages, report, index


def main(args: argparse.Namespace) -> None:
    import faiss

    git = check_clean_or_exit(args.allow_dirty)  # before minutes of building, not after
    faiss.omp_set_num_threads(args.threads)
    if args.synthetic is not None:
        from benchmarks.continual_synthetic import run

        run(args, git)
        return
    faiss.omp_set_num_threads(args.threads)
    data = musique_dir(root=args.data_dir,
                       need=("corpus.json", "questions.json", "openie*.json"))
    openie = musique_openie(data)
    results = Path(args.results or RESULTS / "bench_continual.jsonl")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench_continual_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"threads {torch.get_num_threads()} (torch), {args.threads} (faiss); "
          f"cpu {cpu_model()}; load {os.getloadavg()}; scratch {work}")

    t0 = time.perf_counter()
    import sentence_transformers  # noqa: F401  (the one-off import, measured apart)

    import_s = time.perf_counter() - t0

    from hippo_gpu.config import EncoderConfig
    from hippo_gpu.data import passage_key, read_questions
    from hippo_gpu.evaluate import evaluate_mode
    from hippo_gpu.indexing.build import build_index
    from hippo_gpu.retrieval.searcher import Searcher

    corpus = json.loads((data / "corpus.json").read_text(encoding="utf-8"))
    cut = int(round((1 - args.holdout) * len(corpus)))
    head, tail = corpus[:cut], corpus[cut:]
    cache = work / "embeddings"  # empty: (a) is a first build
    if cache.exists() and any(cache.iterdir()):
        raise SystemExit(f"{cache} is not empty; give a fresh --work folder")
    index_dir = work / "index"
    print(f"corpus {len(corpus)} passages: build {len(head)}, insert/delete {len(tail)}")

    # (a) the 90 % build, cold cache
    start = time.perf_counter()
    base = build_index(head, openie, index_dir, encoder=EncoderConfig(), device=args.device,
                       cache_dir=cache)
    build_s = time.perf_counter() - start
    _stage_table("(a) build 90 % (empty cache)", base.timings, build_s)

    # (b) insert the 10 %
    insert_s, insert_stages, insert_report, grown = _writer_phase(
        index_dir, args.device, cache, lambda w: w.insert(tail, openie))
    _stage_table(f"(b) insert {len(tail)} passages", insert_stages, insert_s)

    # (c) delete them again
    tail_keys = grown.passage_keys[cut:]
    delete_s, delete_stages, delete_report, shrunk = _writer_phase(
        index_dir, args.device, None, lambda w: w.delete(tail_keys))
    _stage_table(f"(c) delete {len(tail_keys)} passages", delete_stages, delete_s)

    # (d) counts and quality against a full build (warm cache; not timed as a denominator)
    start = time.perf_counter()
    full = build_index(corpus, openie, None, encoder=EncoderConfig(), device=args.device,
                       cache_dir=cache)
    full_warm_s = time.perf_counter() - start
    questions = read_questions(data / "questions.json")[:args.questions]
    enc = Searcher(full).encoder
    quality: dict[str, Any] = {}
    ranked = {}
    for name, idx in (("insert", grown), ("full", full), ("delete", shrunk), ("build90", base)):
        res = evaluate_mode(Searcher(idx, encoder=enc), questions, "hipporag2", top_k=200)
        quality[name] = {k: res.recall[k] for k in ("2", "5", "10")}
        ranked[name] = res.ranked_keys

    def agree(a: str, b: str) -> int:
        return sum(x[:10] == y[:10] for x, y in zip(ranked[a], ranked[b]))

    from benchmarks.continual_synthetic import rankings_vs_build

    texts = [q.question for q in questions]

    def ties(a: Any, b: Any) -> dict[str, int]:
        """top-10 of the questions up to certified ties (module docstring, (d))."""
        return rankings_vs_build(a, b, texts, encoder=enc)

    def counts(idx: Any, basis: bool = False) -> dict[str, Any]:
        """The graph's stats, or (`basis`) the solved basis's without its wall time: a commit
        keeps no basis (hipporag2 iterates until a compaction solves it), so (b) and (c)
        compare the graph only and (e), compacted, both."""
        return {k: v for k, v in idx.stats().items()
                if k.startswith("basis_") == basis and k != "basis_seconds"}

    counts_equal = counts(grown) == counts(full)
    delete_equal = counts(shrunk) == counts(base)
    adjacency_insert = _adjacency_diff(grown, full)
    adjacency_delete = _adjacency_diff(shrunk, base)
    ties_insert, ties_delete = ties(grown, full), ties(shrunk, base)

    # (e) a stream of single-passage inserts that ends at the whole corpus: a base of all but
    # the last --stream passages (built from the warm cache: its vectors are the full build's),
    # one writer, one commit per passage, no embedding cache (each passage's texts really
    # encoded), no compaction until the end; then compact and compare with (d)'s full build
    from hippo_gpu.versions.load import load_index
    from hippo_gpu.versions.writer import IndexWriter

    n_stream = min(args.stream, len(corpus) - 1)
    stream = corpus[len(corpus) - n_stream:]
    stream_dir = work / "stream_index"
    build_index(corpus[:len(corpus) - n_stream], openie, stream_dir, encoder=EncoderConfig(),
                device=args.device, cache_dir=cache)
    # each insert hands over only its passage's OpenIE doc (what a pipeline extracting one
    # passage at a time would pass); the file is parsed here, outside the timed loop
    docs = json.loads(openie.read_text(encoding="utf-8"))["docs"]
    doc_of = {passage_key(d["passage"]): d for d in docs if isinstance(d.get("passage"), str)}
    per_insert: list[float] = []
    stream_stages: list[dict[str, float]] = []
    with IndexWriter(stream_dir, device=args.device, cache_dir=None, compact_after=None) as w:
        for passage in stream:
            one = {"docs": [doc_of[passage_key(f"{passage['title']}\n{passage['text']}")]]}
            start = time.perf_counter()
            w.insert([passage], one)
            w.commit()
            report = w.last_change
            per_insert.append(time.perf_counter() - start)
            stream_stages.append(report.stage_seconds)
        start = time.perf_counter()
        chain = load_index(stream_dir, device=args.device)
        chain_load_s = time.perf_counter() - start
        start = time.perf_counter()
        streamed = w.compact()
        stream_compact_s = time.perf_counter() - start
    res = evaluate_mode(Searcher(streamed, encoder=enc), questions, "hipporag2", top_k=200)
    quality["stream"] = {k: res.recall[k] for k in ("2", "5", "10")}
    ranked["stream"] = res.ranked_keys
    stream_equal = counts(streamed) == counts(full)
    basis_equal = counts(streamed, basis=True) == counts(full, basis=True)
    adjacency_stream = _adjacency_diff(streamed, full)
    ties_stream = ties(streamed, full)
    del chain
    first, rest = per_insert[0], per_insert[1:] or per_insert
    p50, p99 = quantile(rest, 0.5), quantile(rest, 0.99)
    typical = min(range(len(per_insert)), key=lambda i: (i == 0, abs(per_insert[i] - p50)))

    def same_row(step: str, what: str, ref: str, equal: bool, adjacency: dict[str, Any],
                 extra: str = "") -> tuple[str, str, str]:
        edges = adjacency["edges"]
        return (f"{step} counts {what} == {ref}", str(equal),
                f"{extra}by name: equal {adjacency['equal']}, edges only one side "
                f"{edges['only_final'] + edges['only_build']}, max |dw| "
                f"{edges['max_weight_diff']:.3g}")

    def quality_rows(step: str, a: str, b: str) -> list[tuple[str, str, str]]:
        return [(f"{step} hipporag2 R@2/5/10 {a} | {b}",
                 "/".join(str(v) for v in quality[a].values()),
                 "/".join(str(v) for v in quality[b].values())),
                (f"{step} identical top-10, {a} vs {b}", f"{agree(a, b)}/{len(questions)}",
                 f"beyond certified ties: {tied[step]['beyond_bounds']}")]

    tied = {"(d)": ties_insert, "(c)": ties_delete, "(e)": ties_stream}

    # the table
    print("\n== continual indexing, musique_train "
          f"({len(head)} + {len(tail)} passages, {args.threads} threads, {args.device})")
    rows = [
        ("one-off import of sentence-transformers", f"{import_s:.1f} s", "in neither"),
        ("(a) build 90 %, empty cache", f"{build_s:.1f} s", "denominator"),
        (f"(b) insert {len(tail)} (10 %)", f"{insert_s:.1f} s",
         f"{insert_s / build_s:.1%} of build (target <= {TARGETS['insert']:.0%})"),
        (f"(c) delete {len(tail)}", f"{delete_s:.1f} s",
         f"{delete_s / build_s:.1%} of build (target <= {TARGETS['delete']:.0%})"),
        ("(d) full build, warm cache (not a denominator)", f"{full_warm_s:.1f} s", ""),
        same_row("(d)", "insert", "full build", counts_equal, adjacency_insert),
        same_row("(c)", "delete", "90 % build", delete_equal, adjacency_delete),
        *quality_rows("(d)", "insert", "full"),
        *quality_rows("(c)", "delete", "build90"),
        ("(e) stream: first insert (loads the encoder)", f"{first * 1e3:.0f} ms", ""),
        (f"(e) stream: inserts 2..{len(per_insert)} p50 / p99",
         f"{p50 * 1e3:.0f} / {p99 * 1e3:.0f} ms",
         f"{1 / p50:.2f} inserts/s at p50"),
        (f"(e) cold load of the {len(per_insert)}-segment chain", f"{chain_load_s:.2f} s", ""),
        ("(e) compaction at the end", f"{stream_compact_s:.2f} s", str(w.last_compaction)),
        same_row("(e)", "after compaction", "full build", stream_equal, adjacency_stream,
                 f"basis steps/bytes equal {basis_equal}; "),
        *quality_rows("(e)", "stream", "full"),
    ]
    width = max(len(r[0]) for r in rows) + 2
    for name, value, note in rows:
        print(f"{name:<{width}}{value:>18}   {note}")
    _stage_table(f"(e) the median insert (#{typical + 1})", stream_stages[typical],
                 per_insert[typical])
    s = grown.stats()
    print("\ncounts after (b): " + ", ".join(f"{k} {s[k]}" for k in (
        "passage_nodes", "phrase_nodes", "facts", "edges", "synonym_pairs")))
    changes = {k: v for k, v in insert_report.as_dict().items() if k != "stage_seconds"}
    print(f"(b) changes: {json.dumps(changes)}")

    line = {
        **provenance("continual", threads=args.threads, device=args.device,
                     encoder_backend=EncoderConfig().backend, precision="float32",
                     query_precision=None,
                     batch_sizes={"encoder_batch_size": EncoderConfig().batch_size,
                                  "stream_passages_per_insert": 1},
                     optional_versions=("faiss", "sentence_transformers", "hippo_gpu"), git=git),
        "passages": {"build": len(head), "insert": len(tail), "stream": len(stream)},
        "import_seconds": round(import_s, 2),
        "build_seconds": round(build_s, 2), "build_stages": base.timings,
        "insert_seconds": round(insert_s, 2), "insert_stages": insert_stages,
        "insert_ratio": round(insert_s / build_s, 4),
        "delete_seconds": round(delete_s, 2), "delete_stages": delete_stages,
        "delete_ratio": round(delete_s / build_s, 4),
        "targets": TARGETS,
        "insert_report": changes,
        "delete_report": {k: v for k, v in delete_report.as_dict().items()
                          if k != "stage_seconds"},
        "full_build_warm_seconds": round(full_warm_s, 2),
        "counts_insert": grown.stats(), "counts_full": full.stats(),
        "counts_equal": counts_equal, "counts_delete_equal_build": delete_equal,
        "adjacency_insert_vs_full": adjacency_insert,
        "adjacency_delete_vs_build": adjacency_delete,
        "quality_hipporag2_recall": quality, "questions": len(questions),
        "top10_identical_insert_vs_full": agree("insert", "full"),
        "top10_identical_delete_vs_build": agree("delete", "build90"),
        "top10_ties_insert_vs_full": ties_insert, "top10_ties_delete_vs_build": ties_delete,
        "stream_ms": {"first": round(first * 1e3, 1), "p50": round(p50 * 1e3, 1),
                      "p99": round(p99 * 1e3, 1), "n": len(rest),
                      "all": [round(x * 1e3, 1) for x in per_insert]},
        "stream_typical_stages": stream_stages[typical],
        "stream_base_passages": len(corpus) - n_stream,
        "stream_chain_load_seconds": round(chain_load_s, 3),
        "stream_compact_seconds": round(stream_compact_s, 3),
        "stream_compact_stages": w.last_compaction,
        "counts_stream_equal_full": stream_equal, "basis_stream_equal_full": basis_equal,
        "adjacency_stream_vs_full": adjacency_stream,
        "top10_identical_stream_vs_full": agree("stream", "full"),
        "top10_ties_stream_vs_full": ties_stream,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    append_result_or_exit(results, line, allow_dirty=args.allow_dirty)
    print(f"\nappended to {results}")


if __name__ == "__main__":
    main(ARGS)
