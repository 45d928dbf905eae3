"""The lone query's passage scan against its floors (issue 46): what QUERY_PANEL costs a single
query, and whether any other kernel could give today's bits.

On P random unit passage rows (float32) and one query, one thread:

* ``read``: one torch.sum over the rows (the least a scan can cost), warm (repeated, the rows
  in whatever cache holds them) and cold (after streaming a buffer of --flush-mb, as in a
  query whose fact scan ran first);
* ``scan``: blockwise.scores_against of the one query, warm and cold (what the dense stage runs);
* ``panel GEMMs``: the [QUERY_PANEL, D] x [D, ROW_ALIGN] GEMMs alone (the bits-fixing shape,
  QUERY_PANEL - 1 lanes of zeros for a lone query), warm;
* ``one-lane GEMM``: [1, D] x [D, P] in one call, warm (a kernel without the empty lanes).

Then, per dimension D of --bits-dims, on 37 queries x 3,572 rows: the share of scores_against's
entries equal to a sequential FMA chain over d = 0 .. D-1, computed in float64 and rounded
once per step (emulated, so a double rounding can rarely differ), and whether the same GEMMs
written into windows of one [40, 3,572] output (leading dimension 3,572 instead of ROW_ALIGN)
keep its bits at 1 and 2 threads. If both held at every D, a fixed-order kernel for small
batches could keep today's bits. Issue 46's note gives the verdict.

One JSON line is appended to benchmarks/results/bench_scan_floor.jsonl.

    python -m benchmarks.bench_scan_floor --threads 1
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from benchmarks.common import (
    RESULTS,
    add_arguments,
    append_result_or_exit,
    check_clean_or_exit,
    init_threads,
    provenance,
)
from benchmarks.timing import summarize, time_call

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/retrieval/blockwise.py", "hippo_gpu/device.py")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--passages", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=64, help="D of the timed rows (hash:64's)")
    ap.add_argument("--bits-dims", type=int, nargs="+", default=[64, 384])
    ap.add_argument("--flush-mb", type=int, default=512, help="streamed before each cold call")
    ap.add_argument("--repeats", type=int, default=30)
    add_arguments(ap)
    args = ap.parse_args()
    threads = init_threads(args.threads)
    git = check_clean_or_exit(args.allow_dirty)

    import numpy as np
    import torch

    from hippo_gpu.retrieval.blockwise import QUERY_PANEL, ROW_ALIGN, panel_slabs, scores_against

    gen = torch.Generator().manual_seed(0)

    def unit(rows: int, dim: int) -> torch.Tensor:
        return torch.nn.functional.normalize(torch.randn(rows, dim, generator=gen), dim=1)

    emb, query = unit(args.passages, args.dim), unit(1, args.dim)
    flush = torch.ones(args.flush_mb << 18)  # float32: 4 bytes each

    def warm(fn: Callable[[], object]) -> float:
        return time_call(fn, repeats=args.repeats, max_seconds=30).median * 1e3

    def cold(fn: Callable[[], object]) -> float:
        samples = []
        for _ in range(args.repeats):
            flush.sum()
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        return summarize(samples[0], samples).median * 1e3

    def panels() -> None:
        for _ in panel_slabs(query, emb):
            pass

    ms = {
        "read_warm": warm(emb.sum), "read_cold": cold(emb.sum),
        "scan_warm": warm(lambda: scores_against(query, emb)),
        "scan_cold": cold(lambda: scores_against(query, emb)),
        "panel_gemms_warm": warm(panels),
        "one_lane_gemm_warm": warm(lambda: query @ emb.T),
    }
    ms = {k: round(v, 3) for k, v in ms.items()}
    print(f"threads {threads}, P {args.passages}, D {args.dim}, QUERY_PANEL {QUERY_PANEL}, "
          f"ROW_ALIGN {ROW_ALIGN}; ms: {ms}")
    print(f"scan / read: warm {ms['scan_warm'] / ms['read_warm']:.2f}x, "
          f"cold {ms['scan_cold'] / ms['read_cold']:.2f}x")

    bits = {}
    for dim in args.bits_dims:
        width = 3 * ROW_ALIGN + 500  # three full slabs and a tail, as in the tests
        rows, q = unit(width, dim), unit(37, dim)
        panel = scores_against(q, rows).numpy()
        a, b = q.double().numpy(), rows.double().numpy()
        chain = np.zeros(panel.shape, np.float32)
        for d in range(dim):  # fma(q_d, v_d, acc): exact product, one rounding (emulated)
            chain = (chain.astype(np.float64) + np.outer(a[:, d], b[:, d])).astype(np.float32)
        padded = torch.cat([q, q.new_zeros((-37 % QUERY_PANEL, dim))])
        same_window = {}
        before = torch.get_num_threads()
        for t in (1, 2):
            torch.set_num_threads(t)
            want = scores_against(q, rows)
            wide = torch.empty((padded.shape[0], width))
            for c in range(0, width, ROW_ALIGN):
                slab_t = rows[c:c + ROW_ALIGN].T
                for r in range(0, padded.shape[0], QUERY_PANEL):
                    torch.mm(padded[r:r + QUERY_PANEL], slab_t,
                             out=wide[r:r + QUERY_PANEL, c:c + slab_t.shape[1]])
            same_window[f"threads_{t}"] = bool(torch.equal(wide[:37], want))
        torch.set_num_threads(before)
        bits[f"D{dim}"] = {"fma_chain_equal_share": round(float((chain == panel).mean()), 4),
                           "windowed_output_same_bits": same_window}
        print(f"D {dim}: panel entries equal to a sequential FMA chain "
              f"{bits[f'D{dim}']['fma_chain_equal_share']:.4f}; GEMMs into windows of a wider "
              f"output keep the bits: {same_window}")

    record = {
        **provenance("bench_scan_floor", threads=args.threads, device="cpu", encoder_backend=None,
                     precision="float32",
                     batch_sizes={"queries": 1, "query_panel": QUERY_PANEL,
                                  "row_align": ROW_ALIGN}, git=git),
        "passages": args.passages, "dim": args.dim, "flush_mb": args.flush_mb,
        "ms": ms, "scan_over_read": {"warm": round(ms["scan_warm"] / ms["read_warm"], 2),
                                     "cold": round(ms["scan_cold"] / ms["read_cold"], 2)},
        "bits": bits,
    }
    append_result_or_exit(RESULTS / "bench_scan_floor.jsonl", record,
                          allow_dirty=args.allow_dirty)


if __name__ == "__main__":
    main()
