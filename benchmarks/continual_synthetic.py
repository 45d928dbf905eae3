"""Continual indexing at scale on a synthetic corpus (hash:64): what one change costs as the index
grows, and what a chain of segments costs readers until a compaction.

    python -m benchmarks.bench_continual --threads 1 --synthetic 100000 [--stream 1000]

On hippo_gpu.synthetic's corpus of N + changes passages (musique_train's OpenIE statistics):

(a) build the index of the first N passages (a one-off, beside the per-change figures);
(b) `--repeat` single-passage inserts, one commit each (one long-lived writer, no compaction):
    ms p50 / p99 and the stage breakdown of the median one;
(c) `--repeat` single-passage deletes of random passages, the same;
(d) a stream of `--stream` single-passage inserts, one commit each, no compaction: inserts/s,
    and every `--probe` commits the cost of a cold `load_index` of the directory (the base and
    every segment so far replayed) and of a hipporag2 batch of 32 queries on the writer's
    version (no basis: it iterates) — the drift as segments accumulate;
(e) `compact` (the basis solved, a new base written): its time, then the cold load and the
    32-query batch again (now by linearity);
(f) the result against a fresh build of the final corpus: the same phrases, facts, passages,
    counts and adjacency structure, the largest weight difference (float32 rounding of synonym
    cosines), and the same top-10 for the 32 queries. Equality needs an exact synonym kNN
    (`--exact-synonyms`): the default CPU backend at these sizes is the approximate ivf-join
    (recall ~0.95-0.98 against exact), which a fresh build and a writer's exact recomputation of
    the affected lists approximate differently; without it the synonym pairs are reported apart.

Appends one JSON line to benchmarks/results/bench_continual.jsonl (kind "synthetic") with
provenance.py's fields (commit, dirty flag, CPU model, threads, versions).
"""

from __future__ import annotations

import os
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, append_result_or_exit, cpu_model, provenance, quantile


def _ms(xs: list[float]) -> dict[str, float]:
    return {"p50_ms": round(quantile(xs, 0.5) * 1e3, 1),
            "p99_ms": round(quantile(xs, 0.99) * 1e3, 1), "n": len(xs)}


def _median_stages(times: list[float], stages: list[dict[str, float]]) -> dict[str, float]:
    p50 = quantile(times, 0.5)
    i = min(range(len(times)), key=lambda j: abs(times[j] - p50))
    out = dict(stages[i])
    out["(outside the stages)"] = round(times[i] - sum(stages[i].values()), 4)
    return out


def run(args: Any, git: dict[str, Any]) -> None:
    import numpy as np
    import torch

    from hippo_gpu import IndexWriter, Searcher, build_index, load_index
    from hippo_gpu.config import GraphConfig
    from hippo_gpu.synthetic import synthetic_corpus

    n, repeat, stream, probe = args.synthetic, args.repeat, args.stream, args.probe
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="continual_syn_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"threads {torch.get_num_threads()}; cpu {cpu_model()}; scratch {work}")
    corpus = synthetic_corpus(n + repeat + stream, seed=args.seed)
    passages, docs = corpus.passages(), corpus.docs()
    openie = corpus.write(work / "data")["openie"]  # every passage's doc; builds read theirs
    queries = [f"{p.title} {p.text[:80]}" for p in passages[:: max(1, n // 32)][:32]]
    index_dir = work / "index"
    shutil.rmtree(index_dir, ignore_errors=True)
    start = time.perf_counter()
    graph = GraphConfig(knn_backend="torch") if args.exact_synonyms else None
    build_index(passages[:n], openie, index_dir, encoder="hash:64", device="cpu", graph=graph)
    build_s = time.perf_counter() - start
    print(f"(a) build {n} passages: {build_s:.1f} s")

    w = IndexWriter(index_dir, device="cpu", compact_after=None).open()
    ins_t, ins_st, del_t, del_st = [], [], [], []
    for i in range(n, n + repeat):
        t = time.perf_counter()
        w.insert_docs([passages[i]], [docs[i]])
        w.commit()
        ins_t.append(time.perf_counter() - t)
        ins_st.append(w.last_change.stage_seconds)
    rng = np.random.default_rng(args.seed)
    for _ in range(repeat):
        key = w.index.passage_keys[int(rng.integers(len(w.index.passage_keys)))]
        t = time.perf_counter()
        w.delete([key])
        w.commit()
        del_t.append(time.perf_counter() - t)
        del_st.append(w.last_change.stage_seconds)
    print(f"(b) insert {_ms(ins_t)}  (c) delete {_ms(del_t)}")

    def probe_costs() -> dict[str, float]:
        t = time.perf_counter()
        loaded = load_index(index_dir, device="cpu")
        load_s = time.perf_counter() - t
        searcher = Searcher(w.index)
        searcher.rank(queries[:2], top_k=10, mode="hipporag2")  # solver build, first call
        t = time.perf_counter()
        searcher.rank(queries, top_k=10, mode="hipporag2")
        query_s = time.perf_counter() - t
        del loaded
        return {"load_s": round(load_s, 3), "hipporag2_ms_per_query": round(
            query_s / len(queries) * 1e3, 2)}

    drift = [{"segments": 2 * repeat, **probe_costs()}]
    st_t: list[float] = []
    first = n + repeat
    for j, i in enumerate(range(first, first + stream), 1):
        t = time.perf_counter()
        w.insert_docs([passages[i]], [docs[i]])
        w.commit()
        st_t.append(time.perf_counter() - t)
        if j % probe == 0 or j == stream:
            drift.append({"segments": 2 * repeat + j, **probe_costs()})
            print(f"(d) {j} inserts: {drift[-1]}")
    t = time.perf_counter()
    compacted = w.compact()
    compact_s = time.perf_counter() - t
    after = {"segments": 0, **probe_costs()}
    print(f"(e) compact {compact_s:.1f} s {w.last_compaction}; after {after}")
    w.close()

    keys = set(compacted.passage_keys)
    final = [p for p in passages if p.key in keys]
    order = {k: r for r, k in enumerate(compacted.passage_keys)}
    final.sort(key=lambda p: order[p.key])
    fresh = build_index(final, openie, encoder="hash:64", device="cpu", graph=graph)
    adj_a, adj_b = compacted.adjacency, fresh.adjacency
    same = {
        "phrases": compacted.phrases == fresh.phrases, "facts": compacted.facts == fresh.facts,
        "passages": compacted.passage_keys == fresh.passage_keys,
        "counts": compacted.counts == fresh.counts,
        "adjacency_structure": all(torch.equal(getattr(adj_a, f)(), getattr(adj_b, f)())
                                   for f in ("crow_indices", "col_indices")),
    }
    # weights: equal up to the float32 rounding of synonym cosines (a kNN of a few rows rounds
    # its GEMM differently from the build's blocked one; tests/test_writer.py's WEIGHT_TOL)
    same["adjacency_max_weight_diff"] = float((adj_a.values() - adj_b.values()).abs().max()) \
        if same["adjacency_structure"] and adj_a.values().numel() else None
    got = Searcher(compacted).rank(queries, top_k=10, mode="hipporag2")
    want = Searcher(fresh).rank(queries, top_k=10, mode="hipporag2")
    same["top10"] = int((got.passage_rows == want.passage_rows).all(dim=1).sum())
    pairs = [set(zip(x.synonym_src.tolist(), x.synonym_dst.tolist())) for x in (compacted, fresh)]
    same["synonym_pairs_only_writer"] = len(pairs[0] - pairs[1])
    same["synonym_pairs_only_build"] = len(pairs[1] - pairs[0])
    same["synonym_pairs_build"] = len(pairs[1])
    print(f"(f) equal to a fresh build: {same}")
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    record = {
        **provenance("bench_continual", threads=args.threads, device="cpu",
                     batch_sizes={"queries": len(queries)}, git=git),
        "kind": "synthetic", "passages": n, "encoder": "hash:64", "build_s": round(build_s, 1),
        "synonym_knn": "exact (torch)" if args.exact_synonyms else "default",
        "loadavg": os.getloadavg(),
        "insert": _ms(ins_t), "insert_stages": _median_stages(ins_t, ins_st),
        "delete": _ms(del_t), "delete_stages": _median_stages(del_t, del_st),
        "stream": {"inserts": stream, **_ms(st_t),
                   "inserts_per_s": round(len(st_t) / max(sum(st_t), 1e-9), 2)},
        "drift": drift, "compact_s": round(compact_s, 2), "compact_stages": w.last_compaction,
        "after_compaction": after, "equal_to_fresh_build": same, "peak_rss_gb": round(rss_gb, 2),
    }
    append_result_or_exit(Path(args.results or RESULTS / "bench_continual.jsonl"), record,
                          allow_dirty=args.allow_dirty)
