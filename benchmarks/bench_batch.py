"""Batch retrieval of a query file: the local command vs Ray with 1 and 2 workers, in one run.

The queries are musique_train's questions repeated to --rows rows (10,000 by default) as JSON
Lines {"id", "query"}; every row answers them with the same index, mode, top-k and batch size:

* local, T threads: ``hippo_gpu.retrieval.batch.retrieve_file`` (what ``hippo-gpu retrieve`` runs)
in this
  process, for each T in --local-threads; the index is loaded and the encoder warmed first,
  so the figure is the answering alone (load time printed apart);
* ray, W workers x --threads threads: ``hippo_gpu.distributed.retrieve_ray`` (``hippo-gpu
  retrieve --ray``) on a local Ray instance of --ray-cpus CPUs, for each W in --workers. Two
  figures: end to end (``wall``: actors start, load the index, answer, parts joined) and
  ``steady``: rows / (last batch end - first batch start) as the replicas time their own calls
  (so actor start is excluded, as the local row excludes its load). The Ray pool's unit of work
  (and of commit) is a chunk of --part-size rows, small enough to spread over the workers.

Every row's output keys are compared with the first local row's (the count of rows whose top-k
keys differ is printed; it must be 0), and the largest score difference is reported.

Memory per replica, for the sizing model: a fresh subprocess reports its RSS after importing
hippo_gpu, and again after load_index + Searcher + one query (the encoder loads on first use);
the difference is what one more replica (an actor) costs. Each run appends one JSON line to
benchmarks/results/bench_batch.jsonl (see provenance.py; a dirty tree needs --allow-dirty).

    python -m benchmarks.bench_batch --threads 1 --workers 1,2 --local-threads 1,2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS,
    add_arguments,
    append_result,
    check_clean,
    ensure_musique_index,
    musique_dir,
    provenance,
    subprocess_env,
)

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/distributed", "hippo_gpu/retrieval", "hippo_gpu/ppr", "hippo_gpu/embed",
            "kernels/src", "hippo_gpu/config.py", "hippo_gpu/device.py", "hippo_gpu/indexing",
            "hippo_gpu/storage", "hippo_gpu/versions", "hippo_gpu/tables.py")

RESULTS_FILE = RESULTS / "bench_batch.jsonl"

_RSS = """
import json, sys, time
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
import hippo_gpu
from hippo_gpu.device import set_threads
set_threads(int(sys.argv[2]))
before = rss()
t0 = time.perf_counter()
s = hippo_gpu.Searcher(hippo_gpu.load_index(sys.argv[1], device="cpu"))
s.rank(["warm-up"], top_k=1, mode="dense")
print(json.dumps({"rss_imported_mb": before, "rss_loaded_mb": rss(),
                  "load_s": time.perf_counter() - t0}))
"""


def write_queries(path: Path, questions: Path, rows: int) -> None:
    qs = [q["question"] for q in json.loads(questions.read_text())]
    with path.open("w") as f:
        for i in range(rows):
            f.write(json.dumps({"id": i, "query": qs[i % len(qs)]}) + "\n")


def read_out(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def compare(got: list[dict[str, Any]], ref: list[dict[str, Any]]) -> dict[str, Any]:
    assert [g["id"] for g in got] == [r["id"] for r in ref], "ids differ"
    differ = sum(g["keys"] != r["keys"] for g, r in zip(got, ref))
    diff = max((abs(a - b) for g, r in zip(got, ref) for a, b in zip(g["scores"], r["scores"])),
               default=0.0)
    return {"rows_with_different_keys": differ, "max_score_diff": diff}


def memory(index: Path, threads: int) -> dict[str, float]:
    res = subprocess.run([sys.executable, "-c", _RSS, str(index), str(threads)],
                         env=subprocess_env(), capture_output=True, text=True, check=True)
    m = json.loads(res.stdout.strip().splitlines()[-1])
    m["replica_mb"] = m["rss_loaded_mb"] - m["rss_imported_mb"]
    return m


def run_local(index: Path, queries: Path, out: Path, threads: int,
              args: argparse.Namespace) -> dict[str, Any]:
    import hippo_gpu
    from hippo_gpu.device import set_threads
    from hippo_gpu.retrieval.batch import retrieve_file

    set_threads(threads)
    t0 = time.perf_counter()
    searcher = hippo_gpu.Searcher(hippo_gpu.load_index(index, device="cpu"))
    searcher.rank(["warm-up"], top_k=1, mode="dense")
    load = time.perf_counter() - t0
    report = retrieve_file(searcher, queries, out, mode=args.mode, top_k=args.top_k,
                           batch_size=args.batch_size, show_progress=False)
    return {"row": f"local {threads} thr", "kind": "local", "workers": 1, "threads": threads,
            "load_s": load, "run_s": report.seconds, "qps": report.queries_per_s,
            "rows": report.answered}


def run_ray(index: Path, queries: Path, out: Path, workers: int, cpus: float,
            args: argparse.Namespace, spans: Path) -> dict[str, Any]:
    from hippo_gpu.distributed.ray_batch import IndexActor, retrieve_ray
    from hippo_gpu.retrieval.spec import SearcherSpec

    class TimedActor(IndexActor):
        """Records (pid, start, end, rows) of every chunk it answers."""

        def answer(self, rows: Any) -> Any:
            t0 = time.time()
            result = super().answer(rows)
            with open(spans, "a") as f:
                f.write(json.dumps([os.getpid(), t0, time.time(), rows.num_rows]) + "\n")
            return result

    spans.unlink(missing_ok=True)
    cpus_per_worker = min(1.0, (cpus - 1) / workers)
    t0 = time.time()
    spec = SearcherSpec(index, device="cpu", threads=args.threads)
    report = retrieve_ray(spec, queries, out, workers=workers, cpus_per_worker=cpus_per_worker,
                          mode=args.mode, top_k=args.top_k, batch_size=args.batch_size,
                          part_size=args.part_size, actor_cls=TimedActor)
    calls = [json.loads(line) for line in spans.read_text().splitlines()]
    first, last = min(c[1] for c in calls), max(c[2] for c in calls)
    return {"row": f"ray {workers} x {args.threads} thr", "kind": "ray", "workers": workers,
            "threads": args.threads, "cpus_per_worker": cpus_per_worker,
            "actors_seen": len({c[0] for c in calls}), "start_s": first - t0,
            "run_s": last - first, "wall_s": report.seconds, "qps": report.answered /
            (last - first), "qps_wall": report.queries_per_s, "rows": report.answered}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default=None, help="musique_train folder")
    ap.add_argument("--index-dir", default=str(Path.home() / ".cache" / "hippo_gpu" / "indexes"
                                               / "bench_batch-musique_train"))
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--mode", default="hipporag2")
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--part-size", type=int, default=500, help="Ray: rows per chunk")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per Ray worker")
    ap.add_argument("--local-threads", default="1,2", help="thread counts of the local rows")
    ap.add_argument("--workers", default="1,2", help="Ray pool sizes")
    ap.add_argument("--ray-cpus", type=int, default=os.cpu_count() or 2,
                    help="CPUs of the local Ray instance")
    add_arguments(ap)
    args = ap.parse_args()
    git = check_clean(args.allow_dirty)

    import ray

    data = musique_dir(args.data_dir, need=("questions.json",))
    index = Path(args.index_dir)
    build_s = ensure_musique_index(data, index)  # from the cached embeddings, once
    mem = memory(index, args.threads)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        work = Path(tmp)
        queries = work / "queries.jsonl"
        write_queries(queries, data / "questions.json", args.rows)
        outs: list[Path] = []
        for t in [int(x) for x in args.local_threads.split(",")]:
            outs.append(work / f"local-{t}.jsonl")
            results.append(run_local(index, queries, outs[-1], t, args))
            print(results[-1], flush=True)
        ray.init(address="local", num_cpus=args.ray_cpus, include_dashboard=False,
                 log_to_driver=False)
        try:
            for w in [int(x) for x in args.workers.split(",")]:
                outs.append(work / f"ray-{w}.jsonl")
                results.append(run_ray(index, queries, outs[-1], w, args.ray_cpus, args,
                                       work / "spans.jsonl"))
                print(results[-1], flush=True)
        finally:
            ray.shutdown()
        ref = read_out(outs[0])
        for r, out in zip(results, outs):
            r.update(compare(read_out(out), ref))
    base = results[0]["qps"]
    print(f"\nbatch retrieval, musique_train questions x {args.rows} rows, mode {args.mode}, "
          f"top-{args.top_k}, batch {args.batch_size}; replica memory "
          f"{mem['replica_mb']:.0f} MB (RSS {mem['rss_loaded_mb']:.0f} MB after load)")
    print(f"{'row':<20}{'q/s':>9}{'x local-1':>10}{'run s':>8}{'start/load s':>13}"
          f"{'q/s e2e':>9}{'keys differ':>12}{'max |dscore|':>13}")
    for r in results:
        start = r.get("start_s", r.get("load_s", 0.0))
        e2e = r.get("qps_wall", r["rows"] / (r["run_s"] + r.get("load_s", 0.0)))
        print(f"{r['row']:<20}{r['qps']:>9.1f}{r['qps'] / base:>10.2f}{r['run_s']:>8.1f}"
              f"{start:>13.1f}{e2e:>9.1f}{r['rows_with_different_keys']:>12d}"
              f"{r['max_score_diff']:>13.2e}")
    record = provenance("batch", threads=args.threads, device="cpu",
                        encoder_backend="auto",  # SearcherOptions.query_backend in each worker
                        batch_sizes={"query_batch": args.batch_size},
                        optional_versions=("ray", "pyarrow"), git=git)
    import torch

    record.update(rows=args.rows, mode=args.mode, top_k=args.top_k, ray_cpus=args.ray_cpus,
                  part_size=args.part_size,
                  index=str(index), index_build_s=build_s, memory=mem, results=results,
                  torch_threads_local=[r["threads"] for r in results if r["kind"] == "local"],
                  torch_version=torch.__version__)
    append_result(RESULTS_FILE, record, allow_dirty=args.allow_dirty)
    print(f"appended to {RESULTS_FILE}")


if __name__ == "__main__":
    main()
