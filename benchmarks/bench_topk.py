"""The rank stage against its read floor (issue 53 item 3): ranking.topk_stable, old and new.

On Q rows of P random float32 scores (the final scores of a batch), k = 10:

* ``new``: topk_stable as shipped (torch.topk; its indices kept where it took every tie at the
  cut, which with float scores is every row);
* ``old``: the exact cut on every row (ranking._cut_at after torch.topk: what topk_stable ran
  before, five passes and a cumulative sum over each row);
* ``topk``: torch.topk alone;
* ``read floor``: one read of the same bytes (torch.sum), the least a selection can cost.

Each row: ms per query (median of repeats, first call apart), new and old over the read floor,
and whether new and old agree bit for bit. One JSON line is appended to
benchmarks/results/bench_topk.jsonl.

    python -m benchmarks.bench_topk --threads 1
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
MEASURES = ("hippo_gpu/retrieval/ranking.py",)

RESULTS = "benchmarks/results/bench_topk.jsonl"
K = 10


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--passages", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--queries", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--max-seconds", type=float, default=10.0, help="per timed call set")
    ap.add_argument("--results", default=RESULTS, help="where the results line goes")
    add_arguments(ap)
    args = ap.parse_args()
    threads = init_threads(args.threads)
    git = check_clean_or_exit(args.allow_dirty)

    import torch

    from hippo_gpu.retrieval.ranking import _cut_at, topk_stable

    def old(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kth = torch.topk(scores, K, dim=1).values[:, -1:]
        idx = _cut_at(scores, kth, K)
        by_val = torch.sort(scores.gather(1, idx), dim=1, descending=True, stable=True)
        return by_val.values, idx.gather(1, by_val.indices)

    def ms(fn, q: int) -> float:
        return time_call(fn, repeats=args.repeats, max_seconds=args.max_seconds).median \
            * 1e3 / q

    gen = torch.Generator().manual_seed(0)
    rows = []
    print(f"threads {threads}, k = {K}; ms per query", flush=True)
    for p in args.passages:
        for q in args.queries:
            scores = torch.rand(q, p, generator=gen)
            same = all(torch.equal(a, b) for a, b in zip(old(scores), topk_stable(scores, K)))
            row = {"passages": p, "queries": q, "k": K,
                   "new_ms_per_query": ms(lambda s=scores: topk_stable(s, K), q),
                   "old_ms_per_query": ms(lambda s=scores: old(s), q),
                   "topk_ms_per_query": ms(lambda s=scores: torch.topk(s, K, dim=1), q),
                   "read_floor_ms_per_query": ms(lambda s=scores: s.sum(), q),
                   "bit_identical": same}
            row["new_over_read_floor"] = row["new_ms_per_query"] / row["read_floor_ms_per_query"]
            row["old_over_read_floor"] = row["old_ms_per_query"] / row["read_floor_ms_per_query"]
            rows.append(row)
            new_x, old_x = row["new_over_read_floor"], row["old_over_read_floor"]
            print(f"P {p:>8} Q {q:>3}: new {row['new_ms_per_query']:6.2f}  old "
                  f"{row['old_ms_per_query']:6.2f}  topk {row['topk_ms_per_query']:6.2f}  read "
                  f"floor {row['read_floor_ms_per_query']:5.2f}  (new {new_x:.1f}x, old "
                  f"{old_x:.1f}x the floor)  identical {same}", flush=True)
    record = provenance("bench_topk", threads=threads, device="cpu", encoder_backend=None,
                        git=git, batch_sizes={"queries": args.queries,
                                              "passages": args.passages})
    record["rows"] = rows
    append_result_or_exit(args.results, record, allow_dirty=args.allow_dirty)


if __name__ == "__main__":
    main()
