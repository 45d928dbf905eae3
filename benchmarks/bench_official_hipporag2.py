"""The official HippoRAG 2 code and hippo_gpu's hipporag2 mode, side by side in one process.

On musique_train (1,890 passages, the authors' OpenIE file, 100 questions), one run times:

* official: the authors' package itself (a copy outside this repository, ``--upstream``; its
  files untouched), built with its own ``HippoRAG.index`` and queried with its own
  ``HippoRAG.retrieve``. Its LLM is stubbed out: OpenIE answers from the stored extraction, the
  recognition-memory filter keeps the top 5 facts unchanged (HippoRAG 2 without the filter, as
  hippo_gpu's hipporag2 mode), and its encoder is the same all-MiniLM-L6-v2 (sentence-
  transformers, local weights); benchmarks/upstream_hipporag.py holds every injection, and the
  results line lists them. Two rows: all questions in one ``retrieve()`` call (the package
  encodes them up front in one batch, then ranks one at a time), and one question per call.
  Before each timed pass the package's memo of query embeddings is emptied, so each pass pays
  for encoding its queries; the first pass (cold) is reported apart.
* hippo_gpu: ``Searcher(index).rank(questions, top_k=200, mode="hipporag2")`` at batch 1 and at
  batch 100, on hippo_gpu's own index of the same data (``--index-dir``, built once).

Both sides run at ``--threads`` (torch intra-op, OpenMP/MKL/OpenBLAS; default 1). The official
index build (encoding every passage, phrase and fact, synonym edges) is a one-off reported apart
(``--work-dir`` keeps it: a later run with the same package loads it instead, and the line says
so). Recall (R@1/2/5/10) is ``hippo_gpu.evaluate.recall_at_k`` on both sides' passage keys. The
top-10 lists are compared per question: same order, same set, and whether they differ beyond
ties (a passage at a position where the official scores of the two passages are not equal
within 1e-6 of the top score). The official ranking of a few questions depends on
PYTHONHASHSEED (a tie at its top-5 phrase cut is broken by the order of a Python set), so such a
question can differ beyond ties under one seed and not another; the line records the seed. One
JSON line is appended to
benchmarks/results/bench_official_hipporag2.jsonl, each row labelled with what ran; a run needs a
clean tree unless ``--allow-dirty`` (see provenance.py). Getting the package (nothing is copied
into this repository)::

    pip download --pre --no-deps hipporag==2.0.0a4 -d /tmp/hipporag_pkg
    python -m zipfile -e /tmp/hipporag_pkg/hipporag-2.0.0a4-py3-none-any.whl /tmp/hipporag_upstream
    python -m benchmarks.bench_official_hipporag2 --upstream /tmp/hipporag_upstream

Without the package or the data the script prints SKIP and exits 2.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks.common import (
    EMBEDDING_CACHE,
    RESULTS,
    Timing,
    add_arguments,
    append_result_or_exit,
    check_clean_or_exit,
    init_threads,
    limit_threads,
    musique_dir,
    musique_index,
    musique_openie,
    provenance,
    skip,
    time_call,
)
from benchmarks.upstream_hipporag import (
    STUBS,
    Upstream,
    UpstreamNotFound,
    forget_queries,
    locate,
    retrieve,
)

RECALL_KS = (1, 2, 5, 10)
AGREE_K = 10
TIE_RTOL = 1e-6  # scores within this fraction of the query's top score are a tie
MARKER = "hippo_gpu_bench.json"  # in --work-dir: which package and corpus built it


def _parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--upstream", default=None,
                    help="folder of the official package: an unpacked hipporag wheel, or a "
                         "HippoRAG source tree (hipporag/ or src/hipporag/ inside)")
    ap.add_argument("--upstream-source", default=None,
                    help="how the copy was obtained, when it cannot be read from it (an "
                         "exported git tree: 'OSU-NLP-Group/HippoRAG@<commit>')")
    ap.add_argument("--threads", type=int, default=1, help="torch + OpenMP/BLAS threads")
    ap.add_argument("--data-dir", default=None,
                    help="the musique_train folder (default $HIPPO_DATA_DIR/musique_train, "
                         "$HIPPO_DATA_DIR default ../shared/data)")
    ap.add_argument("--index-dir", default="/tmp/mus_index", help="hippo_gpu's index; built "
                    "here if missing")
    ap.add_argument("--work-dir", default=None,
                    help="the official package's save_dir, kept (a build there from the same "
                         "package and corpus is loaded); default a temporary folder")
    ap.add_argument("--top-k", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3, help="recorded passes per row")
    ap.add_argument("--cache-dir", default=None,
                    help="hippo_gpu's embedding cache for its index build (default "
                         "~/.cache/hippo_gpu/embeddings)")
    ap.add_argument("--results", default=None,
                    help="JSONL path (default benchmarks/results/bench_official_hipporag2.jsonl)")
    add_arguments(ap)
    return ap.parse_args(argv)


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:  # thread variables before numpy/torch/igraph load; no progress bars
    os.environ.setdefault("TQDM_DISABLE", "1")
    init_threads(ARGS.threads)

import hashlib  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from hippo_gpu.data import passage_key, read_questions  # noqa: E402
from hippo_gpu.embed.encoder import resolve_model_path  # noqa: E402
from hippo_gpu.evaluate import recall_at_k  # noqa: E402
from hippo_gpu.retrieval.searcher import Searcher  # noqa: E402

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line); the official package is pinned by its content hash
MEASURES = ("hippo_gpu/retrieval", "hippo_gpu/ppr", "hippo_gpu/embed", "kernels/src",
            "hippo_gpu/config.py", "hippo_gpu/device.py", "hippo_gpu/indexing",
            "hippo_gpu/storage", "hippo_gpu/versions", "hippo_gpu/tables.py", "hippo_gpu/data.py",
            "hippo_gpu/evaluate.py", "benchmarks/upstream_hipporag.py")

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")


def find_upstream(args: argparse.Namespace) -> Upstream:
    """The package named by --upstream, or a SKIP exit."""
    if not args.upstream:
        skip("no --upstream: pass the folder of the official HippoRAG package (see the "
             "docstring: pip download --pre --no-deps hipporag, unzipped outside the repo)")
    try:
        return locate(args.upstream, args.upstream_source)
    except UpstreamNotFound as e:
        skip(str(e))


def _label_threads(threads: int) -> str:
    return f"{threads} thread{'s' if threads != 1 else ''}"


def _row(label: str, pipeline: str, batch: int, q: int, timing: Timing,
         keys: list[list[str]], gold: list[set[str]]) -> dict[str, Any]:
    """A row from the timing of passes over `q` queries (first pass apart) and the rankings."""
    return {"label": label, "pipeline": pipeline, "mode": "hipporag2", "Q": q,
            "query_batch": batch, "ms_per_query": timing.median * 1e3 / q,
            "p20_ms_per_query": timing.p20 * 1e3 / q, "p80_ms_per_query": timing.p80 * 1e3 / q,
            "queries_per_s": q / timing.median, "first_pass_ms": timing.first * 1e3,
            "runs": timing.runs, "recall": recall_at_k(keys, gold, RECALL_KS)}


def run_hippo_gpu(searcher: Searcher, texts: list[str], gold: list[set[str]], batch: int,
                  args: argparse.Namespace, label: str) -> tuple[dict[str, Any], list]:
    """hippo_gpu's hipporag2 at `batch` queries per rank call; the row and the ranked keys."""
    keys = searcher.index.passage_keys
    holder: dict[str, list[list[int]]] = {}

    def run() -> None:
        rows: list[list[int]] = []
        for i in range(0, len(texts), batch):
            rows += searcher.rank(texts[i:i + batch], top_k=args.top_k,
                                  mode="hipporag2").passage_rows.tolist()
        holder["rows"] = rows

    timing = time_call(run, device=searcher.device, warmup=0, repeats=args.repeats)
    ranked = [[keys[j] for j in rows] for rows in holder["rows"]]
    return _row(label, "hippo_gpu", batch, len(texts), timing, ranked, gold), ranked


def run_official(rag: Any, texts: list[str], gold: list[set[str]], batch: int,
                 args: argparse.Namespace, label: str) -> tuple[dict[str, Any], list]:
    """The package's retrieve() on `batch` questions per call; the row and, per question, its
    (passage keys, official scores)."""
    holder: dict[str, list] = {}

    def run() -> None:
        forget_queries(rag)  # each pass encodes its queries, as new queries
        out: list = []
        for i in range(0, len(texts), batch):
            out += retrieve(rag, texts[i:i + batch], args.top_k)
        holder["out"] = out

    timing = time_call(run, warmup=0, repeats=args.repeats)
    answers = [([passage_key(doc) for doc in docs], np.asarray(scores, dtype=np.float64))
               for docs, scores in holder["out"]]
    row = _row(label, "official", batch, len(texts), timing, [k for k, _ in answers], gold)
    return row, answers


def agreement(ours: list[list[str]], official: list[tuple[list[str], np.ndarray]]) -> dict:
    """Top-10 of hippo_gpu against the official package's, per question.

    A question differs beyond ties when some position i < 10 holds a passage whose official
    score differs from the official score at position i by more than TIE_RTOL x the top score
    (or that is not in the official top_k at all): a swap of tied passages is not a difference.
    """
    same_order = same_set = beyond = 0
    differ: list[dict[str, Any]] = []
    for qi, (mine, (theirs, scores)) in enumerate(zip(ours, official)):
        mine, top = mine[:AGREE_K], theirs[:AGREE_K]
        same_order += mine == top
        same_set += set(mine) == set(top)
        if mine == top:
            continue
        score_of = dict(zip(theirs, scores.tolist()))
        tol = TIE_RTOL * abs(float(scores[0])) if len(scores) else 0.0
        real = [i for i, key in enumerate(mine) if key != top[i] and (
            key not in score_of or abs(score_of[key] - float(scores[i])) > tol)]
        beyond += bool(real)
        differ.append({"question": qi, "positions": [i for i in range(len(mine))
                                                     if mine[i] != top[i]],
                       "beyond_ties": real})
    n = max(len(official), 1)
    return {"k": AGREE_K, "questions": len(official), "same_order": same_order,
            "same_set": same_set, "differ_beyond_ties": beyond,
            "top10_order": same_order / n, "top10_set": same_set / n, "disagreements": differ}


def _corpus_id(passages: list[str], openie: Path) -> str:
    digest = hashlib.sha256()
    for p in passages:
        digest.update(p.encode() + b"\0")
    digest.update(openie.read_bytes())
    return digest.hexdigest()


def official_index(upstream: Upstream, passages: list[str], openie: Path,
                   work_dir: Path) -> tuple[Any, dict[str, Any]]:
    """The package's HippoRAG over `passages` in `work_dir`: loaded when a build of the same
    package and corpus is there (its MARKER), else built there from scratch."""
    from benchmarks.upstream_hipporag import build, import_package

    module, stubbed = import_package(upstream)
    want = {"content_sha256": upstream.content_id, "corpus_sha256": _corpus_id(passages, openie)}
    marker = work_dir / MARKER
    load = marker.exists() and json.loads(marker.read_text()) == want
    if not load and work_dir.exists() and any(work_dir.iterdir()):
        shutil.rmtree(work_dir)  # another package's or corpus's build: start afresh
    work_dir.mkdir(parents=True, exist_ok=True)
    built = build(module, passages, openie, work_dir, resolve_model_path("all-MiniLM-L6-v2"),
                  load=load)
    if not load:
        marker.write_text(json.dumps(want))
    info = {"index": "loaded from --work-dir" if load else "built", "index_s": built.index_s,
            "prepare_retrieval_s": built.prepare_s,
            "openie_passages_answered": built.openie_passages, "graph": built.graph,
            "stubbed_modules": stubbed}
    return built.rag, info


def print_table(rows: list[dict[str, Any]], agree: dict[str, Any]) -> None:
    print(f"\n{'what ran':<86} {'ms/query':>9} {'q/s':>7} "
          + " ".join(f"{'R@' + str(k):>6}" for k in RECALL_KS))
    for r in rows:
        print(f"{r['label']:<86} {r['ms_per_query']:>9.2f} {r['queries_per_s']:>7.1f} "
              + " ".join(f"{r['recall'][str(k)]:>6.2f}" for k in RECALL_KS))
    print(f"top-{agree['k']} hippo_gpu (batch 100) vs official (one retrieve call): same order "
          f"{agree['same_order']}/{agree['questions']}, same set {agree['same_set']}, differ "
          f"beyond ties {agree['differ_beyond_ties']}")


def main(args: argparse.Namespace) -> dict[str, Any]:
    """Run both sides, print the table, append the results line; returns the record."""
    git = check_clean_or_exit(args.allow_dirty)
    data = musique_dir(args.data_dir, need=("corpus.json", "questions.json", "openie*.json"))
    upstream = find_upstream(args)
    openie = musique_openie(data)
    if openie is None:  # musique_dir checked the pattern: unreachable
        skip(f"no openie*.json in {data}")
    limit_threads(args.threads)
    threads = _label_threads(args.threads)
    questions = read_questions(data / "questions.json")
    texts = [q.question for q in questions]
    gold = [{p.key for p in q.gold} for q in questions]
    corpus = json.loads((data / "corpus.json").read_text(encoding="utf-8"))
    passages = [f"{c['title']}\n{c['text']}" for c in corpus]
    q = len(texts)
    print(f"official package: {upstream.source} (sha256 {upstream.content_id[:12]}, "
          f"{upstream.files} files) at {upstream.root}; data {data}; {q} questions; {threads}")

    # hippo_gpu's setup first (its imports and encoder load before the package's stubs exist),
    # then the official build; then every timed row, in one stretch of the run
    start = time.perf_counter()
    index = musique_index(data, args.index_dir,
                          cache_dir=Path(args.cache_dir) if args.cache_dir else EMBEDDING_CACHE)
    searcher = Searcher(index)
    searcher.rank(texts[:1], top_k=args.top_k, mode="hipporag2")  # encoder load, solver build
    ours_setup_s = time.perf_counter() - start
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="hipporag_"))
    try:
        rag, official = official_index(upstream, passages, openie, work)
        print(f"  official index {official['index']} in {official['index_s']:.1f} s, "
              f"prepare_retrieval_objects {official['prepare_retrieval_s']:.1f} s")
        retrieve(rag, texts[:1], args.top_k)  # warm-up: not timed

        rows: list[dict[str, Any]] = []
        ranked: dict[int, list[list[str]]] = {}
        for batch in (1, q):
            row, ranked[batch] = run_hippo_gpu(
                searcher, texts, gold, batch, args,
                f"hippo_gpu hipporag2 (Searcher.rank, batch {batch}), {threads}")
            rows.append(row)
            print(f"  {row['label']}: {row['ms_per_query']:.2f} ms/query")
        what = f"official HippoRAG 2 ({upstream.source}, LLM filter stubbed off)"
        answers: dict[int, list] = {}
        for batch, how in ((q, f"one retrieve() of all {q} questions"),
                           (1, "one question per retrieve()")):
            row, answers[batch] = run_official(rag, texts, gold, batch, args,
                                               f"{what}, {how}, {threads}")
            rows.insert(0 if batch == q else 1, row)
            print(f"  {row['label']}: {row['ms_per_query']:.2f} ms/query")
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)

    official_ms = {r["query_batch"]: r["ms_per_query"] for r in rows if r["pipeline"] == "official"}
    for r in rows:  # ratios within this run: official at the same batch / this row
        ref = official_ms.get(r["query_batch"]) or official_ms[1]
        r["speedup_vs_official"] = round(ref / r["ms_per_query"], 2)
    agree = agreement(ranked[q], answers[q])
    agree["batch_1_vs_batch_100_same_order"] = sum(
        a[:AGREE_K] == b[:AGREE_K] for a, b in zip(ranked[1], ranked[q]))
    agree["official_one_call_vs_per_question_same_order"] = sum(
        a[0][:AGREE_K] == b[0][:AGREE_K] for a, b in zip(answers[q], answers[1]))
    print_table(rows, agree)

    enc = searcher.encoder_config
    backends = sorted({searcher.encoder.backend, "torch"})  # the package's: sentence-transformers
    record = {
        **provenance(
            "official_hipporag2", threads=args.threads, device="cpu",
            encoder_backend=backends[0] if len(backends) == 1 else backends,
            precision=index.precision,
            query_precision=enc.precision,
            batch_sizes={"query_batch": [1, q], "encoder_query_batch_size": enc.query_batch_size,
                         "encoder_batch_size": index.config.encoder.batch_size,
                         "official_embedding_batch_size": 16},
            optional_versions=("igraph", "sentence_transformers", "transformers", "pandas",
                               "hippo_gpu"),
            git=git),
        "upstream": {**upstream.describe(), "stubs": STUBS,
                     "stubbed_modules": official.pop("stubbed_modules"),
                     "between_passes": "the package's query-embedding memo is emptied",
                     "pythonhashseed": os.environ.get("PYTHONHASHSEED")},
        "encoder_backends": {"hippo_gpu": searcher.encoder.backend,
                             "official": "torch (sentence-transformers)"},
        "data": {"name": "musique_train", "passages": len(passages), "questions": q,
                 "openie": openie.name},
        "top_k": args.top_k,
        "official_index": official,
        "hippo_gpu_index": {"nodes": index.num_nodes, "passages": len(index.passage_keys),
                            "facts": len(index.facts), "setup_s": round(ours_setup_s, 3)},
        "agreement": agree,
        "rows": rows,
    }
    path = Path(args.results) if args.results else RESULTS / "bench_official_hipporag2.jsonl"
    append_result_or_exit(path, record, allow_dirty=args.allow_dirty)
    print(f"appended to {path} (commit {record['commit']}, dirty {record['dirty']})")
    return record


if __name__ == "__main__" and ARGS is not None:
    main(ARGS)
