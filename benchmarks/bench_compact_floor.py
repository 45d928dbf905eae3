"""The floor of a compact fact scan (issue 53 item 1): what one lone query's fact stage could cost
with int8 fact vectors, beside the float32 stage it would replace and the dense scan.

    python -m benchmarks.bench_compact_floor --threads 1 [--facts 900000]

On F random fact rows (D = 64; the 100k synthetic index holds ~900k facts) and one query:

* ``fact_stage_f32``: seeds.fact_topk as shipped (k = 5), the stage a lone hipporag2 query pays;
* ``gemv_f32``: one float32 [F, D] x [D] product (numpy/BLAS), no selection;
* ``read_f32`` / ``read_int8``: one read of the float32 rows and of the same rows as int8 (a
  sum over the bytes viewed as int64), the memory floors of the two storage forms;
* ``dot_int8``: exact int8 x int8 -> int32 dot products of every row with the query, a plain
  numba loop (int16 products, int32 sums; checked equal to numpy's int32 product), the first
  pass of a compact scan before its exact re-rank of the few candidate rows;
* ``dense``: the dense passage scan of the same query (scores_against + minmax_rows) over
  P = F / 9 rows, what hipporag2 is compared with.

Nothing here is on the query path: it measures what a compact first pass costs on this CPU, to
decide whether the issue's ratio is reachable. A results line goes to
benchmarks/results/bench_compact_floor.jsonl.
"""

from __future__ import annotations

import argparse

from benchmarks.common import (
    add_arguments,
    append_result_or_exit,
    check_clean_or_exit,
    init_threads,
    provenance,
    time_call,
)

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/retrieval/seeds.py", "hippo_gpu/retrieval/blockwise.py",
            "hippo_gpu/retrieval/ranking.py", "kernels/src")

RESULTS = "benchmarks/results/bench_compact_floor.jsonl"
DIM = 64
K = 5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--facts", type=int, default=900_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--max-seconds", type=float, default=15.0, help="per timed call set")
    ap.add_argument("--results", default=RESULTS, help="where the results line goes")
    add_arguments(ap)
    args = ap.parse_args()
    threads = init_threads(args.threads)
    git = check_clean_or_exit(args.allow_dirty)

    import numba
    import numpy as np
    import torch

    from hippo_gpu.retrieval.blockwise import scores_against
    from hippo_gpu.retrieval.ranking import minmax_rows
    from hippo_gpu.retrieval.seeds import fact_topk

    @numba.njit(boundscheck=False)
    def dot_int8(rows: np.ndarray, query: np.ndarray, out: np.ndarray) -> None:
        q16 = query.astype(np.int16)
        for f in range(rows.shape[0]):
            acc = np.int32(0)
            for d in range(rows.shape[1]):
                acc += np.int16(rows[f, d]) * q16[d]
            out[f] = acc

    gen = torch.Generator().manual_seed(0)
    facts = torch.nn.functional.normalize(torch.randn(args.facts, DIM, generator=gen), dim=1)
    passages = facts[: args.facts // 9].clone()
    query = torch.nn.functional.normalize(torch.randn(1, DIM, generator=gen), dim=1)
    scale = facts.abs().amax(dim=1, keepdim=True) / 127.0  # per-row int8 scale
    codes = torch.round(facts / scale).to(torch.int8).numpy()
    q8 = torch.round(query[0] / (query.abs().max() / 127.0)).to(torch.int8).numpy()
    out = np.empty(args.facts, np.int32)
    dot_int8(codes, q8, out)
    exact = bool(np.array_equal(out, codes.astype(np.int32) @ q8.astype(np.int32)))
    f32, q32 = facts.numpy(), query[0].numpy()

    def ms(fn) -> float:
        return time_call(fn, repeats=args.repeats, max_seconds=args.max_seconds).median * 1e3

    row = {
        "facts": args.facts, "dim": DIM, "queries": 1, "k": K,
        "fact_stage_f32_ms": ms(lambda: fact_topk(query, facts, K)),
        "gemv_f32_ms": ms(lambda: f32 @ q32),
        "read_f32_ms": ms(lambda: f32.view(np.int64).sum()),
        "read_int8_ms": ms(lambda: codes.view(np.int64).sum()),
        "dot_int8_ms": ms(lambda: dot_int8(codes, q8, out)),
        "dense_ms": ms(lambda: minmax_rows(scores_against(query, passages))),
        "dot_int8_exact": exact,
    }
    print(f"threads {threads}, F {args.facts}, D {DIM}, one query: " + ", ".join(
        f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
        flush=True)
    record = provenance("bench_compact_floor", threads=threads, device="cpu",
                        encoder_backend=None, git=git,
                        batch_sizes={"queries": 1, "facts": args.facts})
    record["rows"] = [row]
    append_result_or_exit(args.results, record, allow_dirty=args.allow_dirty)


if __name__ == "__main__":
    main()
