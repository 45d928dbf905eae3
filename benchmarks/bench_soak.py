"""The soak of a writable server: 32 clients query while a writer inserts and deletes over HTTP.

Builds a synthetic index (hash:64, `--passages`, exact synonym kNN), starts `hippo-gpu serve
--writable` on it (a subprocess on loopback, token set) and runs benchmarks/soak.py's soak:
`--clients` clients send one-query retrieve requests (hipporag2 and dense in turn, top_k 10; at
least `--requests`, and until the last write is done) while a writer sends `--writes`
single-passage writes spread over the requests (every third a delete), each followed by a probe
query for the passage it wrote.
Then it waits for the server to catch up (a compacted base, or the last segment's updated basis
stored: soak.wait_until_served), asks the final version `--final-queries`
queries per mode (top_k as above), and compares the directory's final version with a fresh
build of the final corpus by what a user sees (benchmarks/soak.py: counts, edges and weights
and synonym pairs by name, and each served ranking against the fresh build's up to certified
ties — hipporag2 within the two solves' L1 bounds, the server's being its tol; dense, whose
scores carry no certificate, within soak.UNCERTIFIED_TIE), and prints and appends to
benchmarks/results/bench_soak.jsonl: requests, errors by status, writes, query latency p50/p99,
versions seen, the violations of each guarantee (tests/serve/test_soak.py asserts them at a
small size: all must be 0), the final-vs-fresh-build comparison (`fresh_build`: rankings
that differ and, which must be 0, that differ beyond the bounds), the server's RSS (start,
peak, end once the server caught up), the
versions it still holds in memory at the end (its hippo_index_versions_in_memory gauge: 1) and
the versions collected (directories removed) by the end. Exits 1 (after writing the line) when
a guarantee broke.

    python -m benchmarks.bench_soak --threads 1 [--passages 10000] [--requests 4000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from benchmarks.common import (
    RESULTS,
    add_arguments,
    append_result_or_exit,
    check_clean_or_exit,
    init_threads,
    provenance,
)

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/serve", "hippo_gpu/cli/serve.py", "hippo_gpu/retrieval", "hippo_gpu/ppr",
            "hippo_gpu/embed", "kernels/src", "hippo_gpu/storage", "hippo_gpu/versions",
            "hippo_gpu/indexing", "hippo_gpu/config.py", "hippo_gpu/device.py",
            "hippo_gpu/tables.py")

MODES = ("hipporag2", "dense")


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, required=True, help="torch threads (both processes)")
    ap.add_argument("--passages", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=4_000, help="at least this many queries")
    ap.add_argument("--writes", type=int, default=120)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--final-queries", type=int, default=20,
                    help="queries per mode asked of the final version and of a fresh build")
    ap.add_argument("--knn-backend", default="faiss-flat",
                    help="synonym kNN of the index (default exact: from 50k phrases 'auto' is "
                         "the approximate ivf-join, and two approximate builds differ by the "
                         "join's recall, so the final index would not equal a fresh build)")
    ap.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--results", default=None)
    add_arguments(ap)
    return ap.parse_args()


def main(args: argparse.Namespace) -> None:
    import torch

    from benchmarks import soak as S
    from hippo_gpu import Searcher, build_index, load_index
    from hippo_gpu.config import GraphConfig, RetrievalConfig
    from hippo_gpu.ppr import default_tol
    from hippo_gpu.storage.directory import is_index_dir, read_manifest
    from hippo_gpu.synthetic import synthetic_corpus

    git = check_clean_or_exit(args.allow_dirty)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench_soak_"))
    pool = args.writes + 1
    corpus = synthetic_corpus(args.passages + pool, seed=0)
    passages, docs = corpus.passages(), corpus.docs()
    files = corpus.write(work / "data")
    index_dir = work / "index"
    graph = GraphConfig(knn_backend=args.knn_backend)
    build_index(passages[:args.passages], files["openie"], index_dir, encoder="hash:64",
                device="cpu", graph=graph)
    rows = [{"key": p.key, "title": p.title, "text": p.text,
             "triples": [list(t) for t in d.triples]} for p, d in zip(passages, docs)]
    ops, final = S.write_plan(rows[:args.passages], rows[args.passages:], args.writes, seed=1)
    queries = [f"{p.title} {p.text[:60]}" for p in passages[:args.passages:37]]
    start_version = int(read_manifest(index_dir)["version"])
    with S.WritableServer(index_dir, work / "server.log", token="bench-soak-token",
                          threads=args.threads) as server:
        log = asyncio.run(S.soak(server, ops, S.Corpus({r["key"]: r for r in
                                                        rows[:args.passages]}),
                                 queries, clients=args.clients, requests=args.requests,
                                 top_k=args.top_k, modes=MODES))
        last = max((w.version for w in log.writes if w.version is not None), default=0)
        t = time.monotonic()
        final_version = S.wait_until_served(index_dir, last, timeout_s=600)
        settle_wait_s = time.monotonic() - t
        time.sleep(3)  # the server removes the old versions just after the switch
        rss_end = server.rss_mb()
        in_memory = S.versions_in_memory(server)
        asked = queries[:args.final_queries]
        finals = asyncio.run(S.final_queries(server, asked, top_k=args.top_k, modes=MODES))
        tail = server.tail(2000)
    got = load_index(index_dir, device="cpu")
    want = build_index([{"title": r["title"], "text": r["text"]} for r in final.rows.values()],
                       files["openie"], None, encoder="hash:64", device="cpu", graph=graph)
    fresh = S.index_differences(got, want)
    # the served rankings against the fresh build's: hipporag2 within both certificates (the
    # server's ≤ its tol, the server's default), dense within UNCERTIFIED_TIE
    served_tol = default_tol(torch.float32)
    offline = Searcher(want)
    rankings: dict[str, dict[str, int]] = {}
    for mode in MODES:
        ranked = offline.rank(asked, top_k=args.top_k, mode=mode, config=RetrievalConfig())
        hits = offline.to_hits(ranked)
        count = {"queries": len(asked), "queries_differ": 0, "positions_differ": 0,
                 "beyond_bounds": 0}
        ppr_bound = ranked.ppr_bound
        for i, q in enumerate(r for r in finals if r.mode == mode):
            bound = 2 * S.UNCERTIFIED_TIE  # dense scores (and a dense fallback's): no certificate
            if mode == "hipporag2" and ppr_bound is not None and not ranked.dense_fallback[i]:
                bound = served_tol + float(ppr_bound[i])
            d, b = S.ranking_differences([(h["key"], h["score"]) for h in q.hits or []],
                                         [(h.key, h.score) for h in hits[i]], bound)
            count["queries_differ"] += d > 0
            count["positions_differ"] += d
            count["beyond_bounds"] += b
        rankings[mode] = count
    fresh["rankings"] = rankings
    same = fresh["equal"] and all(r["beyond_bounds"] == 0 for r in rankings.values())
    remaining = sorted(p.name for p in index_dir.iterdir() if p.is_dir() and
                       p.name[:1] in "vs" and p.name[1:].isdigit())
    record = {
        **provenance("bench_soak", threads=args.threads, device="cpu", encoder_backend="hash",
                     batch_sizes={"queries_per_request": 1, "clients": args.clients}, git=git),
        "passages": args.passages, "knn_backend": args.knn_backend, "clients": args.clients,
        "requests": len(log.queries),
        "wall_s": round(log.wall_s, 1), "statuses": S.statuses(log),
        "server_errors": dict(S.server_errors(log)), "writes": len(log.writes),
        "query_ms": S.latency_ms(log),
        "versions_seen": len({q.version for q in log.queries}),
        "violations": {"version": len(S.version_violations(log, exhaustive=False)),
                       "visibility": len(S.visibility_violations(log))},
        "violation_examples": (S.version_violations(log, exhaustive=False) +
                               S.visibility_violations(log))[:3],
        "final_equals_fresh_build": same and is_index_dir(index_dir),
        "fresh_build": fresh,
        "settle_wait_s": round(settle_wait_s, 1),
        "rss_mb": S.rss_summary(log, rss_end), "versions_in_memory_end": in_memory,
        "versions_created": final_version - start_version + 1,
        "versions_collected": final_version - start_version + 1 - len(remaining),
        "versions_left": remaining, "loadavg": os.getloadavg(),
        "shared_cpu_note": "2 cores shared with other jobs: latencies are noisy",
    }
    if record["server_errors"] or not same:
        record["server_log_tail"] = tail[-800:]
    print(record)
    append_result_or_exit(Path(args.results or RESULTS / "bench_soak.jsonl"), record,
                          allow_dirty=args.allow_dirty)
    broken = [name for name, bad in (
        ("5xx", record["server_errors"]), ("one version", record["violations"]["version"]),
        ("visibility", record["violations"]["visibility"]),
        ("final equals a fresh build", not record["final_equals_fresh_build"]),
        ("old versions collected", len(remaining) != 1),
        ("one version in memory", in_memory != 1)) if bad]
    if broken:
        raise SystemExit(f"FAILED guarantees: {', '.join(broken)}")


if __name__ == "__main__":
    ARGS = _parse()
    init_threads(ARGS.threads)
    main(ARGS)
