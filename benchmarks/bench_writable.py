"""A writable server under a stream of inserts: queries answered throughout, no reload.

Builds a synthetic index (hash:64, `--passages`), starts `hippo-gpu serve --writable` on it (a
subprocess, token set), and while one client sends hipporag2 queries back to back (one query per
request), posts `--inserts` single-passage inserts (with their triples) one after another. Prints
and appends to benchmarks/results/bench_writable.jsonl: insert latency p50/p99, query latency
p50/p99 before, during and after the stream (after: once the server compacted in the background),
errors (any non-200), the server's RSS (VmRSS) before, at its peak during the stream and after,
and whether the served version moved by segments (the server never reloads the index: its writer
builds each version from the last).

    python -m benchmarks.bench_writable --threads 1 [--passages 10000] [--inserts 200]

Paced (issue 55's soak): `--write-interval 2 --inserts 60 --delete-every 3` starts one write every
2 s (every third a delete of a base passage, the rest inserts) for 2 minutes, and `--fresh-check`
then compares the final directory with a fresh build of the final corpus (benchmarks/soak.py's
index_differences, and the hipporag2 top-10 of the reader's queries up to certified ties).
``during_over_before`` is the p50 query latency during the stream over the p50 before it (the
compacted index, with its basis).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

from benchmarks.common import (
    RESULTS,
    add_arguments,
    append_result_or_exit,
    check_clean_or_exit,
    init_threads,
    provenance,
    quantile,
)

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/serve", "hippo_gpu/cli/serve.py", "hippo_gpu/retrieval", "hippo_gpu/ppr",
            "hippo_gpu/embed", "kernels/src", "hippo_gpu/storage", "hippo_gpu/versions",
            "hippo_gpu/indexing", "hippo_gpu/config.py", "hippo_gpu/device.py",
            "hippo_gpu/tables.py")


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, required=True, help="torch threads (both processes)")
    ap.add_argument("--passages", type=int, default=10_000)
    ap.add_argument("--inserts", type=int, default=200, help="writes in the stream")
    ap.add_argument("--write-interval", type=float, default=0.0,
                    help="seconds from one write's start to the next (0: back to back)")
    ap.add_argument("--delete-every", type=int, default=0,
                    help="every N-th write deletes a base passage (0: inserts only)")
    ap.add_argument("--fresh-check", action="store_true",
                    help="compare the final version with a fresh build of the final corpus")
    ap.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--results", default=None)
    add_arguments(ap)
    return ap.parse_args()


def _ms(xs: list[float]) -> dict[str, float]:
    return {"p50_ms": round(quantile(xs, 0.5) * 1e3, 1) if xs else None,
            "p99_ms": round(quantile(xs, 0.99) * 1e3, 1) if xs else None, "n": len(xs)}


def main(args: argparse.Namespace) -> None:
    import tempfile

    import httpx

    from benchmarks.soak import WritableServer
    from hippo_gpu import build_index
    from hippo_gpu.synthetic import synthetic_corpus

    git = check_clean_or_exit(args.allow_dirty)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench_writable_"))
    corpus = synthetic_corpus(args.passages + args.inserts, seed=0)
    passages, docs = corpus.passages(), corpus.docs()
    files = corpus.write(work / "data")
    index_dir = work / "index"
    build_index(passages[:args.passages], files["openie"], index_dir, encoder="hash:64",
                device="cpu")
    server = WritableServer(index_dir, work / "server.log", token="bench-writable-token",
                            threads=args.threads)
    url, auth = server.url, server.auth
    queries = [f"{p.title} {p.text[:60]}" for p in passages[:64]]
    try:
        server.wait_ready(120)
        with httpx.Client(base_url=url, timeout=300) as c:
            phase = ["before"]
            lat: dict[str, list[float]] = {"before": [], "during": [], "after": []}
            errors: list[str] = []
            stop = threading.Event()

            def reader() -> None:
                i = 0
                with httpx.Client(base_url=url, timeout=300) as rc:
                    while not stop.is_set():
                        t = time.perf_counter()
                        r = rc.post("/v1/retrieve", headers=auth, json={
                            "queries": [queries[i % len(queries)]], "top_k": 10,
                            "mode": "hipporag2"})
                        lat[phase[0]].append(time.perf_counter() - t)
                        if r.status_code != 200:
                            errors.append(f"{r.status_code} {r.text[:200]}")
                        i += 1

            rss = {"before": server.rss_mb()}
            thread = threading.Thread(target=reader)
            thread.start()
            time.sleep(5)
            phase[0] = "during"
            ins: list[float] = []
            dels: list[float] = []
            peak, versions = rss["before"], []
            pool = list(zip(passages[args.passages:], docs[args.passages:]))
            victims = [p.key for p in passages[:args.passages:max(1, args.passages // 97)]]
            final = list(passages[:args.passages])
            start = time.perf_counter()
            for k in range(args.inserts):
                if args.write_interval:
                    time.sleep(max(0.0, start + k * args.write_interval - time.perf_counter()))
                t = time.perf_counter()
                if args.delete_every and (k + 1) % args.delete_every == 0 and victims:
                    key = victims.pop()
                    r = c.request("DELETE", "/v1/passages", headers=auth, json={"keys": [key]})
                    dels.append(time.perf_counter() - t)
                    final = [p for p in final if p.key != key]
                    what = "delete"
                else:
                    p, d = pool.pop(0)
                    r = c.post("/v1/passages", headers=auth, json={"passages": [{
                        "title": p.title, "text": p.text,
                        "triples": [list(x) for x in d.triples]}]})
                    ins.append(time.perf_counter() - t)
                    final.append(p)
                    what = "insert"
                if r.status_code != 200:
                    errors.append(f"{what} {r.status_code} {r.text[:200]}")
                else:
                    versions.append(r.json()["version"])
                peak = max(peak, server.rss_mb())
            rss["peak_during"] = peak
            phase[0] = "settling"
            lat["settling"] = []
            time.sleep(15)  # the server compacts once writes pause (5 s), then serves the basis
            phase[0] = "after"
            time.sleep(5)
            stop.set()
            thread.join(300)
            rss["after"] = server.rss_mb()
            stats = c.get("/v1/stats", headers=auth).json()
    finally:
        server.stop()
    record = {
        **provenance("bench_writable", threads=args.threads, device="cpu", encoder_backend="hash",
                     batch_sizes={"queries_per_request": 1}, git=git),
        "passages": args.passages, "writes": args.inserts, "inserts": len(ins),
        "deletes": len(dels), "write_interval_s": args.write_interval, "insert": _ms(ins),
        "delete": _ms(dels),
        "query_before": _ms(lat["before"]), "query_during": _ms(lat["during"]),
        "query_after": _ms(lat["after"]), "errors": len(errors),
        "during_over_before": round(quantile(lat["during"], 0.5)
                                    / quantile(lat["before"], 0.5), 3)
        if lat["during"] and lat["before"] else None,
        "error_examples": errors[:3], "rss_mb": {k: round(v, 1) for k, v in rss.items()},
        "versions_consecutive": versions == list(range(versions[0], versions[0] + len(versions)))
        if versions else False, "final_stats": {k: stats.get("index", {}).get(k) for k in (
            "passage_nodes", "basis_bytes")},
        "loadavg": os.getloadavg(),
    }
    if args.fresh_check:
        record["fresh_build"] = _fresh_check(index_dir, final, files["openie"], queries)
    print(record)
    append_result_or_exit(Path(args.results or RESULTS / "bench_writable.jsonl"), record,
                          allow_dirty=args.allow_dirty)


def _fresh_check(index_dir: Path, final: list, openie: Path, queries: list[str]) -> dict:
    """The final directory against a fresh build of `final` (module docstring)."""
    from benchmarks.soak import index_differences, ranking_differences
    from hippo_gpu import Searcher, build_index, load_index

    got = load_index(index_dir, device="cpu")
    want = build_index(final, openie, None, encoder="hash:64", device="cpu")
    out = index_differences(got, want)
    differ = beyond = 0
    rankings = [Searcher(x).rank(queries, top_k=10, mode="hipporag2") for x in (got, want)]
    for q in range(len(queries)):
        lists = [list(zip([x.passage_keys[int(i)] for i in r.passage_rows[q].tolist()],
                          r.scores[q].double().tolist())) for x, r in zip((got, want), rankings)]
        bound = float(sum(r.ppr.bound[q] for r in rankings if r.ppr is not None))
        d, b = ranking_differences(lists[0], lists[1], bound)
        differ += d > 0
        beyond += b > 0
    out.update(queries=len(queries), top10_differ=differ, top10_differ_beyond_bounds=beyond,
               basis_updates=got.basis.updates if got.basis is not None else None)
    return out


if __name__ == "__main__":
    ARGS = _parse()
    init_threads(ARGS.threads)
    main(ARGS)
