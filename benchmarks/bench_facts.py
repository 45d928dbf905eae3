"""The fact stage against the GEMM floor (issue 22 item 4): seeds.fact_topk, old and new.

On F random unit fact rows (D = 64, float32) and Q random unit queries, k = 5 (the default
linking_top_k), one run per thread count:

* ``old``: the two-pass torch path (`seeds._fact_topk_blocked`, what fact_topk ran on the CPU
  before the one-pass kernel, over the current scores_against) with the rows per block
  plan_chunks gives at the default budget;
* ``new``: fact_topk as shipped (one read of the facts, running raw top-k, numba);
* ``panel GEMM``: `blockwise.panel_slabs` alone, the fixed-shape GEMMs both paths compute
  (the floor of a stage that keeps today's bits);
* ``one GEMM``: torch.mm of [Q, D] x [D, F] in one call, the CPU's GEMM rate for the shape;
* ``dense``: the dense passage scan, scores_against + minmax_rows over P = F / 9 rows;
* ``read floor``: one read of the same bytes (torch.sum over the fact rows, and over the
  passage rows), measured in the same run: the least a scan can cost (issue 46 asks the lone
  query's fact stage and dense scan to come within 3x of it).

Each row: ms per query (median of repeats, first call apart; 20th percentiles beside them),
GFLOP/s (2 Q F D per call), the new stage as a fraction of the one-GEMM rate, fact stage vs
dense scan per row scanned, the fact stage and the dense scan of the whole batch as multiples of
their read floors, and whether new and old agree bit for bit (values and rows). One
JSON line is appended to benchmarks/results/bench_facts.jsonl.

    python -m benchmarks.bench_facts --threads 1
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
            "hippo_gpu/retrieval/ranking.py", "kernels/src", "hippo_gpu/config.py",
            "hippo_gpu/device.py")

RESULTS = "benchmarks/results/bench_facts.jsonl"
DIM = 64
K = 5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--facts", type=int, nargs="+", default=[450_000, 900_000])
    ap.add_argument("--queries", type=int, nargs="+", default=[1, 8, 32, 64, 256])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-seconds", type=float, default=20.0, help="per timed call set")
    add_arguments(ap)
    args = ap.parse_args()
    threads = init_threads(args.threads)
    git = check_clean_or_exit(args.allow_dirty)

    import torch

    from hippo_gpu import kernels
    from hippo_gpu.config import RetrievalConfig
    from hippo_gpu.device import chunk_budget
    from hippo_gpu.retrieval.blockwise import block_rows, panel_slabs, scores_against
    from hippo_gpu.retrieval.ranking import minmax_rows
    from hippo_gpu.retrieval.seeds import FACT_BYTES, _fact_topk_blocked, fact_topk

    if not kernels.AVAILABLE or kernels.FORCE_TORCH:
        raise SystemExit("the numba kernel path is off: nothing new to measure")
    budget = chunk_budget(RetrievalConfig(), torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    queries = torch.nn.functional.normalize(torch.randn(max(args.queries), DIM, generator=gen),
                                            dim=1)

    p20: dict[str, float] = {}  # the 20th percentile of each timing of the current row

    def timed(fn, name: str) -> float:
        t = time_call(fn, repeats=args.repeats, max_seconds=args.max_seconds)
        p20[name] = t.p20
        return t.median

    def gemm_only(x, emb) -> None:
        for _ in panel_slabs(x, emb):
            pass

    def read_floor(rows) -> float:
        """Seconds to read `rows` once: one torch.sum, its 20th percentile over the repeats."""
        return time_call(lambda: rows.sum(), repeats=args.repeats,
                         max_seconds=args.max_seconds).p20

    def measure(x, facts, passages, floors: tuple[float, float]) -> dict:
        q, f = x.shape[0], facts.shape[0]
        flop = 2.0 * q * f * DIM
        size = block_rows(f, FACT_BYTES * q, budget)  # what plan_chunks gives the old path
        old = _fact_topk_blocked(x, facts, K, size)
        new = fact_topk(x, facts, K, size)
        same = bool(torch.equal(old[0], new[0]) and torch.equal(old[1], new[1]))
        t_new = timed(lambda: fact_topk(x, facts, K, size), "new")
        t_old = timed(lambda: _fact_topk_blocked(x, facts, K, size), "old")
        t_panel = timed(lambda: gemm_only(x, facts), "panel_gemm")
        t_mm = timed(lambda: torch.mm(x, facts.T), "one_gemm")
        t_dense = timed(lambda: minmax_rows(scores_against(x, passages)), "dense")
        per_row_new = t_new / (q * f)
        per_row_dense = t_dense / (q * passages.shape[0])
        return {"facts": f, "queries": q, "rows_per_block": size, "k": K,
                "old_ms_per_query": t_old * 1e3 / q, "new_ms_per_query": t_new * 1e3 / q,
                "panel_gemm_ms_per_query": t_panel * 1e3 / q,
                "one_gemm_ms_per_query": t_mm * 1e3 / q,
                "one_gemm_gflops": flop / t_mm / 1e9, "new_gflops": flop / t_new / 1e9,
                "new_fraction_of_gemm": t_mm / t_new, "speedup": t_old / t_new,
                "dense_passages": passages.shape[0], "dense_ms_per_query": t_dense * 1e3 / q,
                "dense_ns_per_row": per_row_dense * 1e9, "new_ns_per_row": per_row_new * 1e9,
                "fact_over_dense_per_row": per_row_new / per_row_dense, "bit_identical": same,
                "fact_read_floor_ms": floors[0] * 1e3, "dense_read_floor_ms": floors[1] * 1e3,
                "new_over_read_floor": t_new / floors[0],
                "panel_gemm_over_read_floor": t_panel / floors[0],
                "dense_over_read_floor": t_dense / floors[1],
                "p20_ms_per_query": {n: v * 1e3 / q for n, v in p20.items()}}

    rows = []
    print(f"threads {threads}, D = {DIM}, k = {K}; ms per query (GFLOP/s)", flush=True)
    for f in args.facts:
        facts = torch.nn.functional.normalize(torch.randn(f, DIM, generator=gen), dim=1)
        passages = facts[: f // 9].clone()  # P = F / 9 rows for the dense scan
        floors = read_floor(facts), read_floor(passages)
        print(f"F {f:>7}: read floor {floors[0] * 1e3:.2f} ms for {facts.nbytes / 1e6:.0f} MB "
              f"of facts ({facts.nbytes / floors[0] / 1e9:.1f} GB/s), {floors[1] * 1e3:.2f} ms "
              f"for the passages", flush=True)
        for q in args.queries:
            row = measure(queries[:q], facts, passages, floors)
            rows.append(row)
            print(f"F {f:>7} Q {q:>3}: old {row['old_ms_per_query']:7.2f}  new "
                  f"{row['new_ms_per_query']:6.2f} ({row['new_gflops']:5.1f})  panel GEMM "
                  f"{row['panel_gemm_ms_per_query']:6.2f}  one GEMM "
                  f"{row['one_gemm_ms_per_query']:6.2f} ({row['one_gemm_gflops']:5.1f})  "
                  f"new/GEMM rate {row['new_fraction_of_gemm']:4.0%}  x{row['speedup']:.1f}  "
                  f"dense {row['dense_ns_per_row']:.2f} ns/row vs facts "
                  f"{row['new_ns_per_row']:.2f} ({row['fact_over_dense_per_row']:.2f}x)  "
                  f"over read floor: facts {row['new_over_read_floor']:.1f}x, dense "
                  f"{row['dense_over_read_floor']:.1f}x  identical {row['bit_identical']}",
                  flush=True)
    record = provenance("bench_facts", threads=threads, device="cpu", encoder_backend=None,
                        git=git,
                        batch_sizes={"queries": args.queries, "facts": args.facts})
    record["rows"] = rows
    append_result_or_exit(RESULTS, record, allow_dirty=args.allow_dirty)


if __name__ == "__main__":
    main()
