"""Continual indexing at scale on a synthetic corpus (hash:64): what one change costs as the index
grows, and what a chain of segments costs readers until a compaction.

    python -m benchmarks.bench_continual --threads 1 --synthetic 100000 [--stream 1000]

On hippo_gpu.synthetic's corpus of N + changes passages (musique_train's OpenIE statistics):

(a) build the index of the first N passages (a one-off, beside the per-change figures);
(b) `--repeat` single-passage inserts, one commit each (one long-lived writer, no compaction):
    ms p50 / p99 and the stage breakdown of the median one, the writer's open and its first two
    commits (warm-up: `_ms`) apart, and every commit's time and stages (`_each_commit`);
(c) `--repeat` single-passage deletes of random passages, the same;
(d) a stream of `--stream` single-passage inserts, one commit each, no compaction: inserts/s,
    and every `--probe` commits the cost of a cold `load_index` of the directory (the base and
    every segment so far replayed) and of a hipporag2 batch of 32 queries on the writer's
    version (no basis: it iterates) — the drift as segments accumulate;
(e) `compact` (the basis solved, a new base written): its time, then the cold load and the
    32-query batch again (now by linearity);
(f) the result against a fresh build of the final corpus, by what a user sees
    (benchmarks/soak.py's `index_differences` and `ranking_differences`): counts, edges and
    weights and synonym pairs by name (phrase text, passage key: never a row number), with
    tests/versions/index_checks.py's full comparison (`equal`, its first difference if not), and the
    hipporag2 top-10 of the 32 queries up to certified ties (positions that differ, and
    differences beyond the two solves' L1 bounds: must be 0). Equality needs an exact synonym
    kNN (`--exact-synonyms`): the default CPU backend at these sizes is the approximate
    ivf-join (recall ~0.95-0.98 against exact), which a fresh build and a writer's exact
    recomputation of the affected lists approximate differently; without it the synonym pairs
    by name differ, reported apart.

`--phases` picks among b-f (a always runs): at 1M passages the writer's version (~7 GB float32)
and a commit's new one fill most of this machine's 24 GiB, so `--phases insert,delete` leaves out
the probes' cold loads and query batches, the compaction and the second 1M build of (f);
`--phases insert,compact --probe 0` times the compaction alone, and `--no-cold-load` keeps the
probes but times only their query batches (at 1M a cold load beside the writer does not fit).
The build (a) runs in a child process on every core (`build_threads` in the record: a one-off, not a
figure compared with anything), so its peak (16.6 GB at 1M) is returned to the OS before the
writer loads; with `--work DIR` the base is kept as hard links in DIR/base.pristine and a later run
with the same N, seed and synonym kNN starts from it again (its build time read from
DIR/build.json) instead of building.

Appends one JSON line to benchmarks/results/bench_continual.jsonl (kind "synthetic") with
provenance.py's fields (commit, dirty flag, CPU model, threads, versions).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, append_result_or_exit, cpu_model, provenance, quantile

WARMUP = 2  # a writer's first commits: they first touch the two versions a commit holds at once


def _ms(xs: list[float], warmup: int = 0) -> dict[str, Any]:
    """p50 / p99 of commit times; with `warmup` (the writer's first phase: WARMUP) those first
    commits also apart and the p99 over the rest. A writer's first two commits allocate a new
    version beside the loaded one, then the next beside that, and the kernel faults those pages
    in (compacting memory for the huge pages the embedding copies ask for, beside a page cache
    full of the index); later commits get the memory the dropped versions freed. A p99 over
    10-20 commits would otherwise report that one-off as the tail."""
    out: dict[str, Any] = {"p50_ms": round(quantile(xs, 0.5) * 1e3, 1),
                           "p99_ms": round(quantile(xs, 0.99) * 1e3, 1), "n": len(xs)}
    if warmup:
        out["warmup_ms"] = [round(x * 1e3, 1) for x in xs[:warmup]]
        out["p99_after_warmup_ms"] = round(quantile(xs[warmup:] or xs, 0.99) * 1e3, 1)
    return out


def _each_commit(times: list[float], stages: list[dict[str, float]]) -> list[dict[str, float]]:
    """Every commit's seconds and its stages over 10 ms, in order (where a tail comes from)."""
    return [{"s": round(t, 3), **{k: round(v, 3) for k, v in st.items() if v >= 0.01}}
            for t, st in zip(times, stages)]


def _median_stages(times: list[float], stages: list[dict[str, float]]) -> dict[str, float]:
    p50 = quantile(times, 0.5)
    i = min(range(len(times)), key=lambda j: abs(times[j] - p50))
    out = dict(stages[i])
    out["(outside the stages)"] = round(times[i] - sum(stages[i].values()), 4)
    return out


PHASES = ("insert", "delete", "stream", "compact", "compare")
BUILD_THREADS = os.cpu_count() or 1  # (a) only; the timed phases run at --threads


def _write_child(total: int, seed: int, out: str) -> None:
    """corpus.json and openie.json of synthetic_corpus(total, seed) into `out`, in a child
    process (writing 1M passages leaves gigabytes of freed objects in the writing process)."""
    from hippo_gpu.synthetic import synthetic_corpus

    synthetic_corpus(total, seed=seed).write(out)


def _child_main(parent: int, target: Any, *args: Any) -> None:
    """Run `target(*args)`, exiting as soon as the benchmark that started it is gone (killed:
    a build left running would hold its memory for a quarter of an hour)."""
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
    target(*args)


def _in_child(target: Any, *args: Any) -> None:
    child = multiprocessing.get_context("spawn").Process(
        target=_child_main, args=(os.getpid(), target, *args))
    child.start()
    try:
        child.join()
    except BaseException:  # interrupted: the child goes with the benchmark
        child.kill()
        raise
    if child.exitcode != 0:
        raise SystemExit(f"SKIP: {target.__name__} failed in a child process (exit "
                         f"{child.exitcode})")


def _data(work: Path, total: int, seed: int) -> Path:
    """The corpus files of synthetic_corpus(total, seed) in `work` (written once): the OpenIE
    path; every passage's doc is in it, a build reads its passages'."""
    data = work / f"data_{total}_{seed}"
    if not (data / "openie.json").exists():
        shutil.rmtree(work / "data.partial", ignore_errors=True)
        _in_child(_write_child, total, seed, str(work / "data.partial"))
        (work / "data.partial").rename(data)
    return data / "openie.json"


def _build_child(n: int, total: int, seed: int, exact: bool, openie: str, out: str,
                 threads: int) -> None:
    """(a) in a child process: the index of the first n of synthetic_corpus(total, seed)."""
    import torch

    from hippo_gpu import build_index
    from hippo_gpu.config import GraphConfig
    from hippo_gpu.synthetic import synthetic_corpus

    torch.set_num_threads(threads)
    passages = synthetic_corpus(total, seed=seed).passages(0, n)
    build_index(passages, openie, out, encoder="hash:64", device="cpu",
                graph=GraphConfig(knn_backend="torch") if exact else None)


def _base(work: Path, index_dir: Path, openie: Path, n: int, total: int, args: Any) -> float:
    """Build (a) in a child process, or reuse a pristine base of the same parameters: the
    build's seconds."""
    from hippo_gpu.storage.directory import read_manifest

    marker, pristine = work / "build.json", work / "base.pristine"
    want = {"passages": n, "total": total, "seed": args.seed, "exact": bool(args.exact_synonyms)}
    if marker.exists() and pristine.exists():
        got = json.loads(marker.read_text())
        if {k: got.get(k) for k in want} == want:
            read_manifest(pristine)  # an index, or raise
            # an earlier run's commits go; the store never rewrites a file in place (new
            # files, then os.replace), so hard links keep the pristine copy as built
            shutil.rmtree(index_dir, ignore_errors=True)
            shutil.copytree(pristine, index_dir, copy_function=os.link)
            print(f"(a) reusing the base {pristine} (built in {got['build_s']:.1f} s)")
            return float(got["build_s"])
    shutil.rmtree(index_dir, ignore_errors=True)
    shutil.rmtree(pristine, ignore_errors=True)
    marker.unlink(missing_ok=True)
    start = time.perf_counter()
    _in_child(_build_child, n, total, args.seed, bool(args.exact_synonyms), str(openie),
              str(index_dir), BUILD_THREADS)
    build_s = time.perf_counter() - start
    shutil.copytree(index_dir, pristine, copy_function=os.link)
    marker.write_text(json.dumps({**want, "build_s": round(build_s, 1)}))
    return build_s


def run(args: Any, git: dict[str, Any]) -> None:
    import numpy as np
    import torch

    from hippo_gpu import IndexWriter, Searcher, load_index
    from hippo_gpu.config import GraphConfig
    from hippo_gpu.synthetic import synthetic_corpus

    n, repeat, stream, probe = args.synthetic, args.repeat, args.stream, args.probe
    phases = set(args.phases.split(","))
    if not phases <= set(PHASES) or "insert" not in phases:
        raise SystemExit(f"SKIP: --phases takes insert (always) and any of {', '.join(PHASES)}")
    stream = stream if "stream" in phases else 0
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="continual_syn_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"threads {torch.get_num_threads()}; cpu {cpu_model()}; scratch {work}; "
          f"phases {sorted(phases)}")
    total = n + repeat + stream
    openie = _data(work, total, args.seed)
    index_dir = work / "index"
    graph = GraphConfig(knn_backend="torch") if args.exact_synonyms else None
    build_s = _base(work, index_dir, openie, n, total, args)  # before this process holds rows
    print(f"(a) build {n} passages: {build_s:.1f} s")
    corpus = synthetic_corpus(total, seed=args.seed)
    queries = [f"{p.title} {p.text[:80]}" for i in range(0, n, max(1, n // 32))[:32]
               for p in corpus.passages(i, i + 1)]
    if "compare" in phases:
        passages, docs = corpus.passages(), corpus.docs()
    else:  # only the inserted passages as objects (1M passages' are gigabytes)
        passages = [None] * n + corpus.passages(n)  # type: ignore[list-item]
        docs = [None] * n + corpus.docs(n)  # type: ignore[list-item]
    del corpus

    t = time.perf_counter()
    w = IndexWriter(index_dir, device="cpu", compact_after=None).open()
    open_s = time.perf_counter() - t  # one-off: the base read, verified and loaded
    ins_t, ins_st, del_t, del_st = [], [], [], []
    for i in range(n, n + repeat):
        t = time.perf_counter()
        w.insert_docs([passages[i]], [docs[i]])
        w.commit()
        ins_t.append(time.perf_counter() - t)
        ins_st.append(w.last_change.stage_seconds)
    rng = np.random.default_rng(args.seed)
    for _ in range(repeat if "delete" in phases else 0):
        key = w.index.passage_keys[int(rng.integers(len(w.index.passage_keys)))]
        t = time.perf_counter()
        w.delete([key])
        w.commit()
        del_t.append(time.perf_counter() - t)
        del_st.append(w.last_change.stage_seconds)
    print(f"(b) insert {_ms(ins_t, WARMUP)}" + (f"  (c) delete {_ms(del_t)}" if del_t else ""))

    def probe_costs() -> dict[str, float]:
        out = {}
        if not args.no_cold_load:
            t = time.perf_counter()
            loaded = load_index(index_dir, device="cpu")
            out["load_s"] = round(time.perf_counter() - t, 3)
            del loaded
        searcher = Searcher(w.index)
        searcher.rank(queries[:2], top_k=10, mode="hipporag2")  # solver build, first call
        t = time.perf_counter()
        searcher.rank(queries, top_k=10, mode="hipporag2")
        query_s = time.perf_counter() - t
        return {**out, "hipporag2_ms_per_query": round(query_s / len(queries) * 1e3, 2)}

    probing = bool(phases & {"stream", "compact"}) and probe > 0
    segments = len(ins_t) + len(del_t)
    drift = [{"segments": segments, **probe_costs()}] if probing else []
    st_t: list[float] = []
    first = n + repeat
    for j, i in enumerate(range(first, first + stream), 1):
        t = time.perf_counter()
        w.insert_docs([passages[i]], [docs[i]])
        w.commit()
        st_t.append(time.perf_counter() - t)
        if probing and (j % probe == 0 or j == stream):
            drift.append({"segments": segments + j, **probe_costs()})
            print(f"(d) {j} inserts: {drift[-1]}")
    compact_s: float | None = None
    after: dict[str, float] = {}
    same: dict[str, Any] = {}
    if "compact" in phases or "compare" in phases:
        t = time.perf_counter()
        compacted = w.compact()
        compact_s = time.perf_counter() - t
        after = {"segments": 0, **probe_costs()} if probing else {}
        print(f"(e) compact {compact_s:.1f} s {w.last_compaction}; after {after}")
    w.close()
    if "compare" in phases:
        same = _compare(compacted, passages, openie, graph, queries)
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    record = {
        **provenance("bench_continual", threads=args.threads, device="cpu", encoder_backend="hash",
                     batch_sizes={"queries": len(queries)}, git=git),
        "kind": "synthetic", "passages": n, "encoder": "hash:64", "build_s": round(build_s, 1),
        "build_threads": BUILD_THREADS, "writer_open_s": round(open_s, 2),
        "synonym_knn": "exact (torch)" if args.exact_synonyms else "default",
        "phases": [x for x in PHASES if x in phases], "loadavg": os.getloadavg(),
        "insert": _ms(ins_t, WARMUP), "insert_stages": _median_stages(ins_t, ins_st),
        "delete": _ms(del_t) if del_t else None,
        "delete_stages": _median_stages(del_t, del_st) if del_t else None,
        "insert_commits": _each_commit(ins_t, ins_st),
        "delete_commits": _each_commit(del_t, del_st),
        "stream": {"inserts": stream, **_ms(st_t),
                   "inserts_per_s": round(len(st_t) / max(sum(st_t), 1e-9), 2)} if st_t else None,
        "drift": drift, "compact_s": None if compact_s is None else round(compact_s, 2),
        "compact_stages": w.last_compaction, "after_compaction": after,
        "equal_to_fresh_build": same or None, "peak_rss_gb": round(rss_gb, 2),
    }
    append_result_or_exit(Path(args.results or RESULTS / "bench_continual.jsonl"), record,
                          allow_dirty=args.allow_dirty)


def _compare(compacted: Any, passages: list[Any], openie: Path, graph: Any,
             queries: list[str]) -> dict[str, Any]:
    """(f): the compacted index against a fresh build of its corpus, by name."""
    from benchmarks.soak import index_differences
    from hippo_gpu import build_index

    keys = set(compacted.passage_keys)
    final = [p for p in passages if p.key in keys]
    order = {k: r for r, k in enumerate(compacted.passage_keys)}
    final.sort(key=lambda p: order[p.key])
    fresh = build_index(final, openie, encoder="hash:64", device="cpu", graph=graph)
    same = index_differences(compacted, fresh)
    same["top10"] = rankings_vs_build(compacted, fresh, queries)
    print(f"(f) against a fresh build: {same}")
    return same


def rankings_vs_build(got: Any, want: Any, queries: list[str], *, top_k: int = 10,
                      mode: str = "hipporag2", encoder: Any = None) -> dict[str, int]:
    """The top-k of ``queries`` on two indexes of the same corpus, by passage key, up to
    certified ties (benchmarks/soak.py, ranking_differences): each query's two lists within the
    sum of their PPR bounds (a dense-answered query within soak.UNCERTIFIED_TIE). Returns how
    many queries and positions differ and how many differences lie beyond the bounds."""
    from benchmarks.soak import UNCERTIFIED_TIE, ranking_differences
    from hippo_gpu import Searcher

    ranked = [Searcher(x, encoder=encoder).rank(queries, top_k=top_k, mode=mode)
              for x in (got, want)]
    keyed = [[[(x.passage_keys[r], s) for r, s in zip(rows, scores)]
              for rows, scores in zip(rk.passage_rows.tolist(), rk.scores.tolist())]
             for x, rk in zip((got, want), ranked)]
    out = {"queries": len(queries), "queries_differ": 0, "positions_differ": 0,
           "beyond_bounds": 0}
    for i in range(len(queries)):
        bound = 2 * UNCERTIFIED_TIE
        if all(rk.ppr_bound is not None and not bool(rk.dense_fallback[i]) for rk in ranked):
            bound = sum(float(rk.ppr_bound[i]) for rk in ranked if rk.ppr_bound is not None)
        differ, beyond = ranking_differences(keyed[0][i], keyed[1][i], bound)
        out["queries_differ"] += differ > 0
        out["positions_differ"] += differ
        out["beyond_bounds"] += beyond
    return out
