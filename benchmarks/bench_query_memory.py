"""Peak extra memory of one retrieval batch (Searcher.rank at Q = 256) against its chunk budget.

    python -m benchmarks.bench_query_memory --synthetic 10000,100000 --threads 2
    python -m benchmarks.bench_query_memory --index my_index --budgets default,64M,off

For each index, mode and budget (RetrievalConfig.chunk_bytes; "off" = one chunk, the unchunked
path) a fresh child process loads the index, warms the Searcher up with the same mode and budget
(solvers built, encoder loaded: one-off costs, excluded), resets the kernel's peak-RSS mark
(/proc/self/clear_refs, 5) and runs one batch of Q queries with precomputed query vectors. Extra
bytes = VmHWM after the batch - VmRSS before it: everything the batch allocated and touched
(scores, seeds, PPR state and kernel workspace growth, top-k), measured by the kernel rather
than by Python (torch's CPU allocations are invisible to tracemalloc). A fresh process per row
keeps freed-but-resident heap of one row out of the next.

Every row prints the plan (query columns per chunk, fact rows per block), the bytes plan_chunks
charges for it, and the ranking's agreement with the "off" row (identical top-k required).
Synthetic indexes come from hippo_gpu.synthetic.synthetic_corpus with the hash:64 encoder and
are cached under --build-dir. Appends one JSON line to benchmarks/results/bench_query_memory.jsonl.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import (
    RESULTS,
    add_arguments,
    append_result,
    check_clean,
    init_threads,
    provenance,
    subprocess_env,
)

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/retrieval", "hippo_gpu/ppr", "hippo_gpu/embed", "kernels/src",
            "hippo_gpu/config.py", "hippo_gpu/device.py", "hippo_gpu/indexing",
            "hippo_gpu/storage", "hippo_gpu/versions", "hippo_gpu/tables.py",
            "hippo_gpu/synthetic.py")

MODES = ("dense", "hipporag2", "hybrid")
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_budget(text: str) -> int | None:
    """'default' -> None (the config default), 'off' -> one chunk, '64M' / '1G' / '123' bytes."""
    if text == "default":
        return None
    if text == "off":
        return 1 << 50
    if text[-1:].upper() in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1].upper()])
    return int(text)


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure_one(index_dir: str, mode: str, budget: int | None, q: int, top_k: int,
                dtype: str) -> dict:
    """In this (fresh) process: load, warm up, reset the peak mark, run one batch; the numbers."""
    import gc

    import torch

    from hippo_gpu import Searcher, load_index
    from hippo_gpu.config import RetrievalConfig
    from hippo_gpu.device import chunk_budget
    from hippo_gpu.retrieval.modes import mode_of
    from hippo_gpu.retrieval.seeds import FACT_BYTES, NODE_VECTORS, PASSAGE_BYTES, plan_chunks

    index = load_index(index_dir, device="cpu")
    cfg = RetrievalConfig(dtype=dtype)
    if budget is not None:
        cfg = RetrievalConfig(dtype=dtype, chunk_bytes=budget)
    searcher = Searcher(index, cfg)
    titles = index.passage_titles
    step = max(1, len(titles) // q)
    pairs = [(titles[(i * step) % len(titles)], titles[(i * step + step // 2 + 1) % len(titles)])
             for i in range(q)]
    queries = [f"what links {a} and {b}?" for a, b in pairs]
    entities = [list(pair) for pair in pairs] if mode_of(mode).reads_entities else None
    emb = searcher.encoder.encode_queries(queries, "query_to_passage").to(index.device)
    searcher.rank(queries[:1], top_k=top_k, mode=mode, query_emb=emb[:1],  # one-off costs
                  query_entities=None if entities is None else entities[:1])
    gc.collect()
    clear = Path("/proc/self/clear_refs")
    clear.write_text("5")  # reset VmHWM to the current RSS
    before = _status_kb("VmRSS") * 1024
    t0 = time.perf_counter()
    r = searcher.rank(queries, top_k=top_k, mode=mode, query_emb=emb, query_entities=entities)
    seconds = time.perf_counter() - t0
    peak = _status_kb("VmHWM") * 1024
    plan = plan_chunks(index, q, cfg)
    # what plan_chunks charges: the fact stage and the column chunks run one after the other
    per_col = PASSAGE_BYTES * len(index.passage_keys)
    facts = 0
    if mode != "dense":
        per_col += NODE_VECTORS * (8 if dtype == "float64" else 4) * index.num_nodes
        facts = FACT_BYTES * q * min(plan.fact_rows, len(index.facts))
    charged = max(plan.query_cols * per_col, facts)
    return {
        "mode": mode, "dtype": dtype,
        "budget": budget if budget is not None else chunk_budget(cfg, index.device),
        "extra_bytes": peak - before, "rss_before": before, "seconds": round(seconds, 3),
        "query_cols": plan.query_cols, "fact_rows": plan.fact_rows, "charged_bytes": charged,
        "rows": r.passage_rows.tolist(), "scores": r.scores.double().tolist(),
        "sizes": {"N": index.num_nodes, "P": len(index.passage_keys), "F": len(index.facts),
                  "M": len(index.phrases), "D": int(index.passage_emb.shape[1])},
        "torch_threads": torch.get_num_threads(),
    }


def build_synthetic(num: int, build_dir: Path) -> Path:
    from hippo_gpu import build_index
    from hippo_gpu.synthetic import synthetic_corpus

    out = build_dir / f"synthetic_{num}"
    if (out / "index").exists():
        return out / "index"
    t0 = time.perf_counter()
    paths = synthetic_corpus(num, seed=0).write(out)
    build_index(paths["corpus"], paths["openie"], out / "index", encoder="hash:64",
                device="cpu")
    print(f"built synthetic {num}: {time.perf_counter() - t0:.0f} s", flush=True)
    return out / "index"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", action="append", default=[], help="an index directory")
    ap.add_argument("--synthetic", default="", help="passage counts, e.g. 10000,100000")
    ap.add_argument("--build-dir", default="/tmp/hippo_gpu_query_memory")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--budgets", default="off,default,256M,64M")
    ap.add_argument("--queries", type=int, default=256)
    ap.add_argument("--top-k", type=int, default=200)
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"),
                    help="RetrievalConfig.dtype (PPR and seeds)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--results", default=str(RESULTS / "bench_query_memory.jsonl"))
    ap.add_argument("--one", nargs=3, metavar=("INDEX", "MODE", "BUDGET"), help=argparse.SUPPRESS)
    add_arguments(ap)
    args = ap.parse_args()

    if args.one:  # child: one measurement, JSON on the last stdout line
        init_threads(args.threads)
        index_dir, mode, budget = args.one
        print(json.dumps(measure_one(index_dir, mode, parse_budget(budget), args.queries,
                                     args.top_k, args.dtype)))
        return

    git = check_clean(args.allow_dirty)
    indexes = list(args.index)
    for num in filter(None, args.synthetic.split(",")):
        indexes.append(str(build_synthetic(int(num), Path(args.build_dir))))
    env = subprocess_env(args.threads)
    rows = []
    print(f"{'index':<28} {'mode':<10} {'budget':>10} {'cols':>5} {'fact rows':>9} "
          f"{'charged MB':>10} {'extra MB':>9} {'s':>7}  top-k = off")
    for index_dir in indexes:
        for mode in args.modes.split(","):
            reference = None
            for budget in args.budgets.split(","):
                cmd = [sys.executable, "-m", "benchmarks.bench_query_memory",
                       "--one", index_dir, mode, budget,
                       "--queries", str(args.queries), "--top-k", str(args.top_k),
                       "--threads", str(args.threads), "--dtype", args.dtype]
                out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
                if out.returncode != 0:  # recorded, not fatal: the other rows still run
                    error = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "?"
                    rows.append({"index": index_dir, "mode": mode, "budget_arg": budget,
                                 "error": error})
                    print(f"{Path(index_dir).parent.name:<28} {mode:<10} {budget:>10} "
                          f"failed: {error}", flush=True)
                    continue
                row = json.loads(out.stdout.strip().splitlines()[-1])
                ranked, scores = row.pop("rows"), row.pop("scores")
                if budget == "off":
                    reference = (ranked, scores)
                row["identical_to_off"] = (None if reference is None
                                           else (ranked, scores) == reference)
                row.update(index=index_dir, budget_arg=budget)
                rows.append(row)
                print(f"{Path(index_dir).parent.name:<28} {mode:<10} {budget:>10} "
                      f"{row['query_cols']:>5} {row['fact_rows']:>9} "
                      f"{row['charged_bytes'] / 2**20:>10.0f} {row['extra_bytes'] / 2**20:>9.0f} "
                      f"{row['seconds']:>7.2f}  {row['identical_to_off']}", flush=True)
    record = {
        **provenance("query_memory", threads=args.threads, device="cpu", encoder_backend="hash",
                     batch_sizes={"query_batch": [args.queries]}, optional_versions=("numba",),
                     git=git),
        "top_k": args.top_k,
        "dtype": args.dtype,
        "rows": rows,
    }
    path = append_result(args.results, record, allow_dirty=args.allow_dirty)
    print(f"appended to {path}")


if __name__ == "__main__":
    main()
