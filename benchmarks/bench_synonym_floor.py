"""The exact synonym kNN of one commit as the phrase table grows: the floor under a commit's cost
that no storage layout removes on this CPU.

A commit recomputes the synonym lists its change can alter (`synonyms.update_synonym_rows`): it
scans every phrase vector against the C changed ones (one [C, M] GEMM in blocks), merging the
added rows' top-k from those same blocks, and searches the other affected rows (old phrases near
a change) on their own. This benchmark runs that function on M random unit vectors (D 64, the
hash:64 encoder's width) with C of them new, at the phrase counts of the synthetic 10k, 100k,
300k and 1M indexes (85k, 855k, 2.5M, 8.55M), and times, best of `--repeats`, side by side:

    update_ms        the whole function (what a commit pays);
    scan_ms          the scan alone: the [C, B] products and their column max, no top-k (one
                     read of the phrase vectors: what any exact update pays);
    topk_apart_ms    vector_search.exact_topk of the affected rows on their own: what the
                     function paid on top of the scan before the added rows' top-k was merged
                     into it (commit 1784a74 and earlier: scan + this).

Random vectors in 64 dimensions are almost never within the synonym threshold of each other, so
the affected rows are the C new ones (a real commit adds their neighbours).

    python -m benchmarks.bench_synonym_floor --threads 1
    python -m benchmarks.bench_synonym_floor --threads 8 --device cuda --results R.jsonl
        (gpu_check.sh's synonym_floor step: without a CUDA device it says SKIP and exits 2)

One JSON line is appended to benchmarks/results/bench_synonym_floor.jsonl (or --results).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from benchmarks.common import (
    add_arguments,
    append_result_or_exit,
    check_clean_or_exit,
    init_threads,
    provenance,
)

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/indexing/synonyms.py", "hippo_gpu/indexing/vector_search.py", "kernels/src",
            "hippo_gpu/config.py", "hippo_gpu/device.py")

RESULTS = "benchmarks/results/bench_synonym_floor.jsonl"


class _Names(Sequence[str]):
    """M phrase texts without holding M strings (the walk reads only the rows it visits)."""

    def __init__(self, m: int) -> None:
        self.m = m

    def __len__(self) -> int:
        return self.m

    def __getitem__(self, i):  # type: ignore[no-untyped-def, override]
        return f"phrase {int(i)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--phrases", default="85000,855000,2500000,8550000")
    ap.add_argument("--changed", type=int, default=20, help="C: the new phrases of the commit")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda: where the vectors and the "
                    "function run (the timed calls end with the results on the host)")
    ap.add_argument("--results", default=RESULTS)
    add_arguments(ap)
    args = ap.parse_args()
    threads = init_threads(args.threads)
    git = check_clean_or_exit(args.allow_dirty)

    import numpy as np
    import torch

    if args.device not in ("cpu", "cuda"):
        raise SystemExit(f"--device must be cpu or cuda, got {args.device!r}")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("SKIP: no CUDA device (torch.cuda.is_available() is False)")
        raise SystemExit(2)

    from hippo_gpu.config import GraphConfig
    from hippo_gpu.indexing.synonyms import (
        BLOCK_ROWS,
        SynonymEdges,
        synonym_candidates_k,
        update_synonym_rows,
    )
    from hippo_gpu.indexing.vector_search import exact_topk

    cfg = GraphConfig(knn_backend="torch")
    dev = torch.device(args.device)
    rows = []
    print(f"threads {threads}; device {dev}; D 64; C {args.changed}")
    for m in (int(x) for x in args.phrases.split(",")):
        x = torch.nn.functional.normalize(
            torch.randn(m, 64, generator=torch.Generator().manual_seed(0)), dim=1).to(dev)
        added = np.arange(m - args.changed, m, dtype=np.int64)
        to_new = np.arange(m - args.changed, dtype=np.int64)  # the old phrases keep their rows
        none = SynonymEdges(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))
        whole, scan, apart, affected = [], [], [], 0
        for _ in range(args.repeats):
            t = time.perf_counter()
            _, _, aff = update_synonym_rows(to_new, none, _Names(m), x, added,
                                            torch.zeros(0, 64, device=dev), cfg,
                                            backend="torch", device=dev)
            whole.append(time.perf_counter() - t)
            affected = len(aff)
            t = time.perf_counter()
            changed = x[torch.from_numpy(added).to(dev)]
            for start in range(0, m, BLOCK_ROWS):  # each block's max to the host, as the scan
                (changed @ x[start:start + BLOCK_ROWS].T).amax(dim=0).cpu().numpy()
            scan.append(time.perf_counter() - t)
            t = time.perf_counter()
            exact_topk(x, aff, synonym_candidates_k(cfg, m), column_chunk=BLOCK_ROWS)
            apart.append(time.perf_counter() - t)
        row = {"phrases": m, "changed": args.changed, "affected": affected,
               "update_ms": round(min(whole) * 1e3, 1), "scan_ms": round(min(scan) * 1e3, 1),
               "topk_apart_ms": round(min(apart) * 1e3, 1)}
        row["before_ms"] = round(row["scan_ms"] + row["topk_apart_ms"], 1)
        print(row, flush=True)
        rows.append(row)
        del x
    record = {**provenance("synonym_floor", threads=threads, device=args.device, git=git,
                           encoder_backend=None,
                           batch_sizes={"changed": args.changed}),
              "rows": rows}
    append_result_or_exit(args.results, record, allow_dirty=args.allow_dirty)


if __name__ == "__main__":
    main()
