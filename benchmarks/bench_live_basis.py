"""The live passage basis (issue 55): each commit's basis brought current by a low-rank update,
beside a full basis solve, the compacted index and a CLI insert, in one run.

    python -m benchmarks.bench_live_basis --threads 1 [--synthetic 100000] [--repeat 5]

On a synthetic index (hash:64, `--synthetic` passages, built here in a child process) it runs, in
one process on one thread:

1. ``full_solve_s``: ppr.basis.solve_basis of the base graph (the cost a compaction pays; its
   solver build and the passage-mass solve included), the best of `--full-repeats`.
2. `--repeat` single-passage inserts, then `--repeat` single-passage deletes (random base
   passages), each committed by an IndexWriter and followed by its basis update as the server
   runs it: ``update_s`` is prepare_basis_update + finish_basis_update (the changed set, the
   solves on the anchor graph, the algebra: commit to a servable basis); then, off that path,
   ``store_s`` (store_basis_update: the basis written with its segment) and ``next_solver_s``
   (warm_anchor_solver: the float64 solver of the new anchor's graph, which the next update
   needs), and ``work_over_full``, all three over the full solve. Per update also the changed
   nodes, the solved columns, their steps and tol, and the bound the update added over a fresh
   solve's allowance (<= 1: within the basis's tolerance). ``update_over_full_p50``: the
   median over all 2 x `--repeat` updates (also per kind).
3. hipporag2 at Q = `--queries` (Searcher.rank, top 10, median of repeats) on the last updated
   version and on the same version compacted (a fresh solve of its basis), side by side: ms per
   query, whether each query was answered by the push and the edges it scanned, and the top-10
   lists compared up to certified ties (benchmarks/soak.py's ranking_differences with the two
   answers' PPR bounds summed: lists that differ, and lists with a difference beyond them).
4. A CLI insert (`hippo-gpu insert`, one passage, its own small OpenIE file) into the compacted
   index, beside `python -c "import torch, hippo_gpu"` in the same run; then the next reader
   (load_index: it updates the new version's basis from the base and stores it) and its
   hipporag2 at Q = `--queries` against the compacted index's.

A results line goes to benchmarks/results/bench_live_basis.jsonl. Peak RSS (VmHWM) is printed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS,
    add_arguments,
    append_result_or_exit,
    check_clean_or_exit,
    cpu_model,
    init_threads,
    provenance,
    quantile,
    subprocess_env,
)

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/ppr", "hippo_gpu/versions", "hippo_gpu/indexing", "hippo_gpu/storage",
            "hippo_gpu/retrieval", "hippo_gpu/embed", "hippo_gpu/cli", "kernels/src",
            "hippo_gpu/synthetic.py", "hippo_gpu/config.py", "hippo_gpu/device.py",
            "hippo_gpu/tables.py")


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, required=True, help="torch threads")
    ap.add_argument("--synthetic", type=int, default=100_000, help="passages in the base")
    ap.add_argument("--repeat", type=int, default=5, help="single inserts, and as many deletes")
    ap.add_argument("--queries", type=int, default=32, help="hipporag2 batch size")
    ap.add_argument("--full-repeats", type=int, default=2, help="full solves timed (best)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--results", default=None)
    add_arguments(ap)
    return ap.parse_args()


def _hwm_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(args: argparse.Namespace, git: dict[str, Any]) -> None:
    import numpy as np
    import torch

    from benchmarks.bench_scale import _queries
    from benchmarks.continual_synthetic import _build_child, _data, _in_child
    from benchmarks.soak import ranking_differences
    from benchmarks.timing import time_call
    from hippo_gpu.ppr.basis import solve_basis
    from hippo_gpu.retrieval.searcher import Searcher
    from hippo_gpu.synthetic import synthetic_corpus
    from hippo_gpu.versions.load import load_index
    from hippo_gpu.versions.writer import IndexWriter

    n, repeat = args.synthetic, args.repeat
    work = Path(args.work or tempfile.mkdtemp(prefix="live_basis_"))
    work.mkdir(parents=True, exist_ok=True)
    total = n + repeat + 1  # the inserts, and one more for the CLI
    print(f"threads {torch.get_num_threads()}; cpu {cpu_model()}; {n} passages; work {work}",
          flush=True)
    openie = _data(work, total, args.seed)
    index_dir = work / "index"
    t0 = time.perf_counter()
    _in_child(_build_child, n, total, args.seed, False, str(openie), str(index_dir),
              args.threads)
    build_s = time.perf_counter() - t0
    corpus = synthetic_corpus(total, seed=args.seed)

    base = load_index(index_dir, device="cpu")
    assert base.basis is not None
    full = []
    for _ in range(args.full_repeats):
        t = time.perf_counter()
        solve_basis(base.adjacency, base.passage_nodes, base.passage_emb,
                    damping=base.basis.damping)
        full.append(time.perf_counter() - t)
    full_s = min(full)
    print(f"base: {base.num_nodes} nodes, build {build_s:.1f} s; full basis solve "
          f"{full_s:.2f} s (of {[round(x, 2) for x in full]})", flush=True)
    rng = np.random.default_rng(args.seed)
    victims = [base.passage_keys[int(i)] for i in rng.choice(n, size=repeat, replace=False)]
    del base

    updates: list[dict[str, Any]] = []
    with IndexWriter(index_dir, device="cpu", compact_after=None) as w:
        w.warm_anchor_solver()  # the base's, as each later anchor's is built after its update
        ops = [("insert", i) for i in range(n, n + repeat)] + [("delete", k) for k in victims]
        for kind, what in ops:
            if kind == "insert":
                w.insert_docs(corpus.passages(int(what), int(what) + 1),
                              corpus.docs(int(what), int(what) + 1))
            else:
                w.delete([str(what)])
            t = time.perf_counter()
            w.commit()
            commit_s = time.perf_counter() - t
            t = time.perf_counter()
            prepared = w.prepare_basis_update()
            if prepared is None:
                raise SystemExit(f"{kind}: no basis update ran (none prepared)")
            current = w.finish_basis_update(prepared)
            update_s = time.perf_counter() - t
            assert current is not None and current.basis is not None
            t = time.perf_counter()
            assert w.store_basis_update(prepared)
            store_s = time.perf_counter() - t
            t = time.perf_counter()
            w.warm_anchor_solver()
            warm_s = time.perf_counter() - t
            r = prepared.update.report
            total_s = update_s + store_s + warm_s
            row = {"kind": kind, "commit_s": round(commit_s, 3), "update_s": round(update_s, 3),
                   "update_over_full": round(update_s / full_s, 4),
                   "store_s": round(store_s, 3), "next_solver_s": round(warm_s, 3),
                   "work_over_full": round(total_s / full_s, 4), "changed": r.changed,
                   "solved": r.solved, "steps": r.steps, "tol": r.tol,
                   "added_bound_ratio": round(r.added_bound_ratio, 4),
                   "col_bound_max": float(current.basis.col_bound.max())}
            updates.append(row)
            print(f"{kind}: commit {commit_s:.2f} s, update {update_s:.2f} s "
                  f"({row['update_over_full']:.3f} of the full solve; then store {store_s:.2f} "
                  f"s and the next solver {warm_s:.2f} s: all {row['work_over_full']:.3f}; "
                  f"{r.changed} changed, "
                  f"{r.solved} solved, {r.steps} steps at tol {r.tol:.2g}, added bound "
                  f"{r.added_bound_ratio:.3f} of the allowance)", flush=True)
        live = w.index
        compacted = w.compact()
    assert live.basis is not None and compacted.basis is not None
    texts = [t for t, _ in _queries(compacted, args.queries, args.seed)]

    def answer(index: Any) -> dict[str, Any]:
        searcher = Searcher(index.to("cpu"))
        searcher.warm_up()
        timing = time_call(lambda: searcher.rank(texts, top_k=10, mode="hipporag2"),
                           repeats=5, max_seconds=30)
        ranking = searcher.rank(texts, top_k=10, mode="hipporag2")
        ppr = ranking.ppr
        assert ppr is not None and ppr.pushed is not None and ppr.push_work is not None
        return {"ms_per_query": timing.median * 1e3 / len(texts),
                "pushed": int(ppr.pushed.sum()), "push_edges": int(ppr.push_work.sum()),
                "keys": [[index.passage_keys[int(p)] for p in row]
                         for row in ranking.passage_rows.tolist()],
                "scores": ranking.scores.double(), "bound": ppr.bound.double()}

    got, want = answer(live), answer(compacted)
    differ = beyond = 0
    for q in range(len(texts)):
        d, b = ranking_differences(
            list(zip(got["keys"][q], got["scores"][q].tolist())),
            list(zip(want["keys"][q], want["scores"][q].tolist())),
            float(got["bound"][q] + want["bound"][q]))
        differ += d > 0
        beyond += b > 0
    query = {"queries": len(texts), "live_ms": round(got["ms_per_query"], 2),
             "compacted_ms": round(want["ms_per_query"], 2),
             "live_over_compacted": round(got["ms_per_query"] / want["ms_per_query"], 3),
             "live_pushed": got["pushed"], "compacted_pushed": want["pushed"],
             "live_push_edges": got["push_edges"], "compacted_push_edges": want["push_edges"],
             "top10_differ": differ, "top10_differ_beyond_bounds": beyond}
    print(f"hipporag2 Q={len(texts)}: live {query['live_ms']} ms/query, compacted "
          f"{query['compacted_ms']} ({query['live_over_compacted']}x); pushed "
          f"{got['pushed']}/{want['pushed']}, push edges {got['push_edges']}/"
          f"{want['push_edges']}; top-10 lists differing {differ} ({beyond} beyond the "
          "bounds)", flush=True)

    # a CLI insert beside the import it cannot avoid, then the next reader
    one = work / "cli_passage"
    one.mkdir(exist_ok=True)
    i = n + repeat
    p, doc = corpus.passages(i, i + 1)[0], corpus.docs(i, i + 1)[0]
    (one / "corpus.json").write_text(json.dumps([{"title": p.title, "text": p.text}]))
    (one / "openie.json").write_text(json.dumps({"docs": [{
        "idx": p.key, "passage": p.content, "extracted_entities": list(doc.entities),
        "extracted_triples": [list(x) for x in doc.triples]}]}))
    env = subprocess_env(args.threads)
    exe = str(Path(sys.executable).with_name("hippo-gpu"))

    def run(cmd: list[str]) -> float:
        t = time.perf_counter()
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        return time.perf_counter() - t

    import_s = min(run([sys.executable, "-c", "import torch, hippo_gpu"]) for _ in range(2))
    cli_s = run([exe, "insert", str(index_dir), "--corpus", str(one / "corpus.json"),
                 "--openie", str(one / "openie.json"), "--device", "cpu", "--threads",
                 str(args.threads)])
    t = time.perf_counter()
    reader = load_index(index_dir, device="cpu")
    reader_load_s = time.perf_counter() - t
    assert reader.basis is not None and reader.basis.updates == 1
    after = answer(reader)
    cli = {"import_s": round(import_s, 2), "cli_insert_s": round(cli_s, 2),
           "cli_beyond_import_s": round(cli_s - import_s, 2),
           "next_reader_load_s": round(reader_load_s, 2),
           "next_reader_ms": round(after["ms_per_query"], 2),
           "next_reader_over_compacted": round(after["ms_per_query"] / want["ms_per_query"], 3),
           "next_reader_pushed": after["pushed"]}
    print(f"CLI insert {cli_s:.2f} s (import alone {import_s:.2f} s: {cli_s - import_s:.2f} s "
          f"beyond it); the next reader loads in {reader_load_s:.2f} s (its basis updated and "
          f"stored) and answers hipporag2 in {cli['next_reader_ms']} ms/query "
          f"({cli['next_reader_over_compacted']}x the compacted index)", flush=True)

    ratios = [u["update_over_full"] for u in updates]
    summary = {
        "synthetic": n, "build_s": round(build_s, 1), "full_solve_s": round(full_s, 3),
        "update_over_full_p50": quantile(ratios, 0.5),
        "update_over_full_p50_insert": quantile(
            [u["update_over_full"] for u in updates if u["kind"] == "insert"], 0.5),
        "update_over_full_p50_delete": quantile(
            [u["update_over_full"] for u in updates if u["kind"] == "delete"], 0.5),
        "work_over_full_p50": quantile([u["work_over_full"] for u in updates], 0.5),
        "added_bound_ratio_max": max(u["added_bound_ratio"] for u in updates),
        "updates": updates, "query": query, "cli": cli, "peak_rss_mib": round(_hwm_mib(), 1)}
    print(f"update / full solve: p50 {summary['update_over_full_p50']} (inserts "
          f"{summary['update_over_full_p50_insert']}, deletes "
          f"{summary['update_over_full_p50_delete']}); added bound <= "
          f"{summary['added_bound_ratio_max']} of the allowance; peak RSS "
          f"{summary['peak_rss_mib']} MiB", flush=True)
    append_result_or_exit(args.results or RESULTS / "bench_live_basis.jsonl",
                          {**provenance("bench_live_basis", threads=args.threads, device="cpu",
                                        encoder_backend="hash", precision="float64",
                                        batch_sizes={"queries": args.queries}, git=git),
                           **summary},
                          allow_dirty=args.allow_dirty)


if __name__ == "__main__":
    ARGS = _parse()
    init_threads(ARGS.threads)
    main(ARGS, check_clean_or_exit(ARGS.allow_dirty))
