"""The checksums of an index load: one file after the other against storage.durable.sha256_files
(up to 4 files at a time; hashlib releases the GIL), side by side on the same files.

A load verifies every file of its base against the manifest's sha256 (store.read_index_dir), so
at 1M passages (6.8 GiB) the checksums are most of a warm writer's open. This benchmark hashes
every file of an index directory both ways, after one pass that warms the page cache, `--repeats`
times alternating, checks that both give the same digests, and reports the best of each.

    python -m benchmarks.bench_checksums --index DIR [--repeats 2]

One JSON line is appended to benchmarks/results/bench_checksums.jsonl (or --results). A missing
or empty DIR is a SKIP (exit 2).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from benchmarks.common import (
    add_arguments,
    append_result_or_exit,
    check_clean_or_exit,
    provenance,
)

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/storage",)

RESULTS = "benchmarks/results/bench_checksums.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", required=True, help="an index directory (every file is hashed)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--results", default=RESULTS)
    add_arguments(ap)
    args = ap.parse_args()
    git = check_clean_or_exit(args.allow_dirty)

    from hippo_gpu.storage.durable import sha256_file, sha256_files

    root = Path(args.index)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
    if not files:
        print(f"SKIP: no files under {root}")
        raise SystemExit(2)
    size = sum(p.stat().st_size for p in files)
    workers = max(1, min(len(files), os.cpu_count() or 1, 4))
    print(f"{len(files)} files, {size / 2**30:.2f} GiB, {workers} at a time")
    for p in files:  # warm the page cache: both ways then read from memory
        sha256_file(p)
    one, several = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        a = [sha256_file(p) for p in files]
        one.append(time.perf_counter() - t)
        t = time.perf_counter()
        b = sha256_files(files)
        several.append(time.perf_counter() - t)
        if a != b:
            raise SystemExit("FAIL: sha256_files gave other digests than sha256_file")
    row = {"files": len(files), "bytes": size, "workers": workers,
           "one_after_the_other_s": round(min(one), 2), "sha256_files_s": round(min(several), 2),
           "largest_file_bytes": max(p.stat().st_size for p in files)}
    row["ratio"] = round(row["one_after_the_other_s"] / max(row["sha256_files_s"], 1e-9), 2)
    print(row)
    record = {**provenance("checksums", threads=workers, device="cpu", encoder_backend=None,
                           precision=None, git=git),
              "index": str(root), **row}
    append_result_or_exit(args.results, record, allow_dirty=args.allow_dirty)


if __name__ == "__main__":
    main()
