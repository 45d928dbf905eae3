"""What half precision costs on the CPU: index embeddings and query encoding, on musique_train.

Part 1, index embedding precision. The float32 index is loaded three times,
``load_index(dir, precision=P)`` for P in float32, float16, bfloat16, and every question is ranked
in one batch per mode (dense, hipporag2, hybrid) from the same float32 query vectors (encoded
once), so only the embeddings' precision differs. Per (P, mode): Recall@1/2/5/10, top-10
agreement with float32 (same rows in the same order, and same set) and ms/query of the ranking
(queries already encoded: the encoder is the same for every P; median of --repeats calls after a
warm-up).

Part 2, bfloat16 query encoding and batch size. A searcher with
``SearcherOptions(query_precision=QP, query_batch_size=B)`` ranks the questions B at a time (B
queries per rank call and per encoder batch, as a server's micro-batch), for B in --batches (1,
32, 100); a question is batch
dependent when its top-10 (rows, order) at B differs from its top-10 at B = 1. bfloat16 autocast
rounds differently when padding changes the shapes; float32 (QP = float32) is the control and
must show no batch dependence (exit 1 otherwise, after the line is written).

Prints both tables and appends one JSON line (provenance.py) to
benchmarks/results/bench_precision.jsonl; a dirty git tree needs --allow-dirty.

    python -m benchmarks.bench_precision --threads 2
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from benchmarks.common import (
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

MODES = ("dense", "hipporag2", "hybrid")
PRECISIONS = ("float32", "float16", "bfloat16")
KS = (1, 2, 5, 10)


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, required=True, help="torch + OpenMP/BLAS threads")
    ap.add_argument("--index-dir", default="/tmp/mus_index", help="float32 index; built if missing")
    ap.add_argument("--data-dir", default=None,
                    help="default $HIPPO_DATA_DIR/musique_train ($HIPPO_DATA_DIR default "
                         "../shared/data)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--precisions", default=",".join(PRECISIONS),
                    help="index embedding precisions (float32 first: the reference)")
    ap.add_argument("--query-precisions", default="float32,bfloat16",
                    help="query encoder precisions of part 2 (float32: the control)")
    ap.add_argument("--batches", default="1,32,100", help="part 2 batch sizes (first: reference)")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per part 1 row")
    ap.add_argument("--results", default=str(RESULTS / "bench_precision.jsonl"))
    add_arguments(ap)
    return ap.parse_args(argv)


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:  # thread env for OpenMP/BLAS must be set before numpy/torch load
    init_threads(ARGS.threads)

import time  # noqa: E402

import torch  # noqa: E402

from hippo_gpu.data import read_questions  # noqa: E402
from hippo_gpu.evaluate import recall_at_k  # noqa: E402
from hippo_gpu.indexing.index import Index  # noqa: E402
from hippo_gpu.retrieval.options import SearcherOptions  # noqa: E402
from hippo_gpu.retrieval.searcher import Searcher  # noqa: E402

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/retrieval", "hippo_gpu/ppr", "hippo_gpu/embed", "kernels/src",
            "hippo_gpu/config.py", "hippo_gpu/device.py", "hippo_gpu/indexing",
            "hippo_gpu/storage", "hippo_gpu/versions", "hippo_gpu/tables.py", "hippo_gpu/data.py",
            "hippo_gpu/evaluate.py")


def agreement(a: list[list[int]], b: list[list[int]]) -> dict[str, float]:
    """Fractions of queries whose top-10 rows are equal in order, and as sets."""
    n = max(len(a), 1)
    return {"order": sum(x == y for x, y in zip(a, b, strict=True)) / n,
            "set": sum(set(x) == set(y) for x, y in zip(a, b, strict=True)) / n}


def main(args: argparse.Namespace) -> int:
    git = check_clean_or_exit(args.allow_dirty)  # before minutes of measurement, not after
    limit_threads(args.threads)
    data = musique_dir(args.data_dir, need=("questions.json",))
    index_dir = Path(args.index_dir)
    questions = read_questions(data / "questions.json")
    texts = [q.question for q in questions]
    gold = [{p.key for p in q.gold} for q in questions]
    q = len(texts)
    modes = [m for m in args.modes.split(",") if m]
    precisions = [p for p in args.precisions.split(",") if p]
    query_precisions = [p for p in args.query_precisions.split(",") if p]
    batches = [min(int(b), q) for b in args.batches.split(",") if b]
    if precisions[0] != "float32" or query_precisions[0] != "float32":
        raise SystemExit("--precisions and --query-precisions must start with float32")
    print(f"threads {args.threads} (torch {torch.get_num_threads()}), Q={q}, index {index_dir}, "
          f"loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    indexes: dict[str, Index] = {p: musique_index(data, index_dir, precision=p)
                                 for p in precisions}  # built on the first call when missing
    ref_searcher = Searcher(indexes["float32"])
    enc = ref_searcher.encoder_config
    encoder = ref_searcher.encoder  # loaded here, outside the timing
    encoder.encode_queries(texts[:1], "query_to_passage")  # warm-up
    start = time.perf_counter()
    query_emb = encoder.encode_queries(texts, "query_to_passage")  # [Q, D] float32
    encode_ms = (time.perf_counter() - start) * 1e3 / q

    def keys(rows: list[list[int]]) -> list[list[str]]:
        return [[indexes["float32"].passage_keys[j] for j in r] for r in rows]

    # Part 1: index embedding precision
    part1: list[dict] = []
    top10: dict[tuple[str, str], list[list[int]]] = {}
    for p in precisions:
        searcher = Searcher(indexes[p], encoder=ref_searcher.encoder)
        for mode in modes:
            out: dict = {}

            def run(searcher: Searcher = searcher, mode: str = mode, out: dict = out) -> None:
                out["r"] = searcher.rank(texts, top_k=10, mode=mode, query_emb=query_emb)

            t = time_call(run, warmup=1, repeats=args.repeats)
            rows = out["r"].passage_rows.tolist()
            top10[(p, mode)] = rows
            part1.append({
                "precision": p, "mode": mode, "Q": q,
                "recall": recall_at_k(keys(rows), gold, KS),
                "top10_vs_float32": agreement(top10[("float32", mode)], rows),
                "ms_per_query": t.median * 1e3 / q, "p20_ms_per_query": t.p20 * 1e3 / q,
                "p80_ms_per_query": t.p80 * 1e3 / q, "first_call_ms": t.first * 1e3,
                "runs": t.runs,
                "stage_ms_per_query": {k: v * 1e3 / q for k, v in out["r"].stage_seconds.items()},
            })
            print(f"  part 1 {p:<9} {mode:<10} {part1[-1]['ms_per_query']:8.3f} ms/query")

    # Part 2: query encoder precision x batch size, on the float32 index
    part2: list[dict] = []
    for qp in query_precisions:
        for b in batches:
            searcher = Searcher(indexes["float32"], options=SearcherOptions(
                query_precision=qp, query_batch_size=b))
            searcher.encoder.encode_queries(texts[:1], "query_to_passage")  # load outside timing
            for mode in modes:
                start = time.perf_counter()
                rows = []
                for i in range(0, q, b):
                    rows += searcher.rank(texts[i:i + b], top_k=10, mode=mode).passage_rows.tolist()
                ms = (time.perf_counter() - start) * 1e3 / q
                top10[(f"q-{qp}-{b}", mode)] = rows
                ref = top10[(f"q-{qp}-{batches[0]}", mode)]
                part2.append({
                    "query_precision": qp, "query_batch": b, "encoder_query_batch_size": b,
                    "mode": mode, "recall": recall_at_k(keys(rows), gold, KS),
                    "top10_differs_vs_batch_1": {
                        k: 1 - v for k, v in agreement(ref, rows).items()},
                    "top10_vs_float32_batch_1": agreement(
                        top10[(f"q-float32-{batches[0]}", mode)], rows),
                    "ms_per_query_one_pass": ms,
                })
                print(f"  part 2 {qp:<9} batch {b:<4} {mode:<10} {ms:8.3f} ms/query (one pass)")

    print(f"\nPart 1: index embedding precision (Q={q}, float32 query vectors shared; "
          f"encoding {encode_ms:.2f} ms/query not included; threads {args.threads})")
    head = (f"{'precision':<9} {'mode':<10} " + " ".join(f"{'R@' + str(k):>6}" for k in KS)
            + f" {'=order':>7} {'=set':>6} {'ms/query':>9}")
    print(head + "\n" + "-" * len(head))
    for r in part1:
        a = r["top10_vs_float32"]
        print(f"{r['precision']:<9} {r['mode']:<10} "
              + " ".join(f"{r['recall'][str(k)]:>6.2f}" for k in KS)
              + f" {a['order']:>7.2f} {a['set']:>6.2f} {r['ms_per_query']:>9.3f}")
    print("=order / =set: fraction of questions whose top-10 equals float32's (rows in the same "
          "order / as a set)")

    print(f"\nPart 2: query encoder precision x batch (B queries per rank call and encoder "
          f"batch; float32 index; threads {args.threads})")
    head = (f"{'query':<9} {'B':>4} {'mode':<10} " + " ".join(f"{'R@' + str(k):>6}" for k in KS)
            + f" {'!=B1 order':>10} {'!=B1 set':>8} {'=f32 order':>10} {'ms/query':>9}")
    print(head + "\n" + "-" * len(head))
    for r in part2:
        d, a = r["top10_differs_vs_batch_1"], r["top10_vs_float32_batch_1"]
        print(f"{r['query_precision']:<9} {r['query_batch']:>4} {r['mode']:<10} "
              + " ".join(f"{r['recall'][str(k)]:>6.2f}" for k in KS)
              + f" {d['order']:>10.2f} {d['set']:>8.2f} {a['order']:>10.2f} "
              f"{r['ms_per_query_one_pass']:>9.3f}")
    print(f"!=B1: fraction of questions whose top-10 differs from the same precision's at "
          f"B={batches[0]}; =f32: top-10 equal to float32 queries at B={batches[0]}; ms/query: "
          "one pass, encoder included")
    control = [r for r in part2 if r["query_precision"] == "float32"]
    control_ok = all(r["top10_differs_vs_batch_1"]["order"] == 0 for r in control)
    print(f"float32 control (no batch dependence): {'ok' if control_ok else 'FAILED'}")

    record = {
        **provenance("precision", threads=args.threads, device="cpu",
                     encoder_backend=ref_searcher.encoder.backend, precision=precisions,
                     query_precision=query_precisions,
                     batch_sizes={"query_batch": batches, "part1_query_batch": q,
                                  "part1_encoder_query_batch_size": enc.query_batch_size},
                     optional_versions=("sentence_transformers", "hippo_gpu"), git=git),
        "data": str(data), "index": str(index_dir), "Q": q,
        "part1_encode_ms_per_query": encode_ms, "part1": part1, "part2": part2,
        "control_ok": control_ok,
    }
    append_result_or_exit(args.results, record, allow_dirty=args.allow_dirty)
    print(f"appended to {args.results} (commit {record['commit']}, dirty {record['dirty']})")
    return 0 if control_ok else 1


if __name__ == "__main__" and ARGS is not None:
    sys.exit(main(ARGS))
