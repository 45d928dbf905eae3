"""Scale benchmark: a synthetic corpus of P passages through the whole pipeline users run.

Per size P (``--passages 10000,100000,1000000``), each phase in its own process, so each peak RSS
is that phase's own (ru_maxrss of the child):

    gen     hippo_gpu.synthetic.synthetic_corpus(P) written as corpus.json + openie.json (the
            users' input formats); its statistics beside musique_train's
    build   hippo_gpu.build_index(corpus.json, openie.json, out, encoder="hash:64") — the code
            `hippo-gpu index` runs: seconds per stage, peak RSS, index bytes on disk and per
            passage, synonym kNN backend and its sampled edge recall vs exact (manifest)
    query   load_index (seconds; lazy: texts memory-mapped, not parsed), the first
            Searcher.retrieve after load (one hipporag2 query: encoder, solver, first touch of
            the pages), then ms/query at Q = 1, 8, 32, 64, 256 for hipporag2 and dense (median of
            repeats, timing.time_call), each batch's stages, and its fact stage and dense scan
            as multiples of their read floors (one torch.sum of the fact vectors, of the
            passage vectors: the least a scan of those bytes costs, measured in the same
            process); peak RSS
    prpack  igraph prpack (as official HippoRAG calls it) per query on the same adjacency, with
            HippoRAG-2-shaped reset vectors (the query fact's phrases + 0.05 x min-max dense
            passage scores), beside hippo_gpu's personalized_pagerank on the same vectors
            (ms/query and top-10 passage agreement)

Then a table, one JSON line per size in benchmarks/results/bench_scale.jsonl (provenance.py; with
the growth per 10x of build time, peak RSS and ms/query vs the previous size of the run) and a
PNG (benchmarks/plot.py's `plot_scale`: ms/query and peak RSS vs passages).

    python -m benchmarks.bench_scale --passages 10000,100000 --threads 2 --allow-dirty
    python -m benchmarks.bench_scale --passages 1000000 --threads 2 --prpack-queries 3
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS,
    add_arguments,
    append_result,
    check_clean,
    data_root,
    init_threads,
    provenance,
    requested_backend,
    subprocess_env,
    time_call,
)

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/retrieval", "hippo_gpu/ppr", "hippo_gpu/embed", "kernels/src",
            "hippo_gpu/config.py", "hippo_gpu/device.py", "hippo_gpu/indexing",
            "hippo_gpu/storage", "hippo_gpu/versions", "hippo_gpu/tables.py",
            "hippo_gpu/synthetic.py", "hippo_gpu/data.py")


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--passages", default="10000,100000", help="comma list of sizes P")
    ap.add_argument("--threads", type=int, required=True, help="torch + faiss + BLAS threads")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (build and queries)")
    ap.add_argument("--encoder", default="hash:64", help="encoder of the build (default hash:64)")
    ap.add_argument("--knn-backend", default="auto",
                    help="GraphConfig.knn_backend of the build (auto: exact below 50k phrases, "
                         "else ivf-join with held-out recall; or faiss-ivf, faiss-flat ...)")
    ap.add_argument("--batches", default="1,8,32,64,256", help="query batch sizes Q")
    ap.add_argument("--modes", default="hipporag2,hipporag2:chebyshev,dense",
                    help="MODE or MODE:PPR_METHOD (hipporag2 runs the default, auto: the basis "
                         "and push when the index holds a basis; hipporag2:chebyshev the "
                         "iteration)")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats per (mode, Q)")
    ap.add_argument("--prpack-queries", type=int, default=None,
                    help="igraph prpack queries per size (default 8 below 500k passages, else 3)")
    ap.add_argument("--work-dir", default="/tmp/hippo_bench_scale",
                    help="where corpora and indexes are written (removed per size unless --keep)")
    ap.add_argument("--keep", action="store_true", help="keep each size's files")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=21600, help="seconds per phase process")
    ap.add_argument("--results", default=str(RESULTS / "bench_scale.jsonl"))
    ap.add_argument("--plot", default=str(RESULTS / "bench_scale.png"))
    ap.add_argument("--report", action="store_true",
                    help="print the table of the --results lines (latest per size) and exit")
    ap.add_argument("--child", choices=["gen", "build", "query", "prpack"], default=None,
                    help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out-json", default=None, help=argparse.SUPPRESS)
    add_arguments(ap)
    return ap.parse_args(argv)


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux: KiB


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# --- phases (each runs in its own process) -----------------------------------------------------


def phase_gen(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from hippo_gpu.embed import HashEncoder
    from hippo_gpu.synthetic import corpus_statistics, synthetic_corpus

    t0 = time.perf_counter()
    corpus = synthetic_corpus(args.size, seed=args.seed)
    generate_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    files = corpus.write(root / "input")
    write_s = time.perf_counter() - t0
    # statistics on at most 100k passages (the rest of the corpus is drawn the same way)
    sample = synthetic_corpus(min(args.size, 100_000), seed=args.seed)
    stats = corpus_statistics(sample.docs(), embed=HashEncoder(64))
    return {"generate_s": round(generate_s, 2), "write_s": round(write_s, 2),
            "input_bytes": sum(p.stat().st_size for p in files.values()),
            "statistics": stats, "statistics_passages": min(args.size, 100_000),
            "peak_rss_gb": round(_peak_rss_gb(), 3)}


def phase_build(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from hippo_gpu.config import GraphConfig
    from hippo_gpu.indexing.build import build_index

    out = root / "index"
    t0 = time.perf_counter()
    index = build_index(root / "input" / "corpus.json", root / "input" / "openie.json", out,
                        encoder=args.encoder, device=args.device, show_progress=True,
                        graph=GraphConfig(knn_backend=args.knn_backend))
    total = time.perf_counter() - t0
    knn = index.report.get("synonym_knn", {})
    size = _dir_bytes(out)
    return {"build_s": round(total, 2), "stages_s": index.timings, "index_bytes": size,
            "bytes_per_passage": round(size / args.size), "synonym_knn": knn,
            "counts": index.counts, "peak_rss_gb": round(_peak_rss_gb(), 3)}


def _queries(index: Any, count: int, seed: int) -> list[tuple[str, int]]:
    """Questions from random facts: "Who or what <predicate> <object>?" and the fact's row."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = rng.choice(len(index.facts), size=min(count, len(index.facts)), replace=False)
    out = []
    for j in rows.tolist():
        s, p, o = index.facts[j]
        out.append((f"Who or what {p} {o}?", j))
    return out


def phase_query(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    import torch

    from hippo_gpu.config import RetrievalConfig
    from hippo_gpu.retrieval.searcher import Searcher
    from hippo_gpu.versions.load import load_index

    t0 = time.perf_counter()
    index = load_index(root / "index", device=args.device)
    load_s = time.perf_counter() - t0
    rss_after_load = _peak_rss_gb()
    batches = [int(b) for b in args.batches.split(",")]
    texts = [q for q, _ in _queries(index, max(batches), args.seed)]
    searcher = Searcher(index)
    floors = {name: time_call(lambda e=emb: e.sum(), device=torch.device(args.device),
                              repeats=max(args.repeats, 5), max_seconds=30).p20
              for name, emb in (("facts", index.fact_emb), ("dense", index.passage_emb))}
    t0 = time.perf_counter()
    first = searcher.retrieve(texts[:1], top_k=10, mode="hipporag2")
    first_s = time.perf_counter() - t0
    searcher.wait_for_codes()  # the first query started a lone query's fact codes: time them
    out: dict[str, Any] = {"load_s": round(load_s, 3), "first_query_s": round(first_s, 3),
                           "first_query_title": first[0][0].title if first[0] else None,
                           "rss_after_load_gb": round(rss_after_load, 3), "ms_per_query": {},
                           "read_floor_ms": {k: round(v * 1e3, 3) for k, v in floors.items()},
                           "over_read_floor": {}}
    dev = torch.device(args.device)
    tops: dict[str, Any] = {}
    out["stages_ms_per_query"] = {}
    for spec in args.modes.split(","):
        mode, _, method = spec.partition(":")
        cfg = RetrievalConfig(ppr_method=method or "auto")
        for q in batches:
            batch = (texts * (q // len(texts) + 1))[:q]
            t = time_call(lambda b=batch, m=mode, c=cfg: searcher.rank(b, top_k=10, mode=m,
                                                                       config=c),
                          device=dev, warmup=0 if q >= 256 else 1, repeats=args.repeats,
                          max_seconds=60)
            out["ms_per_query"][f"{spec}@{q}"] = round(t.median * 1e3 / q, 3)
            ranking = searcher.rank(batch, top_k=10, mode=mode, config=cfg)  # its stages
            out["stages_ms_per_query"][f"{spec}@{q}"] = {
                k: round(v * 1e3 / q, 3) for k, v in ranking.stage_seconds.items()}
            over = {k: round(ranking.stage_seconds[k] / floors[k], 2) for k in floors
                    if k in ranking.stage_seconds}  # the whole batch's stage / one read
            out["over_read_floor"][f"{spec}@{q}"] = over
            print(f"  {spec} Q={q}: {t.median * 1e3 / q:.2f} ms/query "
                  f"{out['stages_ms_per_query'][f'{spec}@{q}']}; over read floor {over}",
                  flush=True)
            if q == max(batches):
                tops[spec] = ranking
                report = ranking.ppr
                if report is not None and report.pushed is not None:
                    nnz = index.adjacency.values().numel()
                    work = report.push_work[report.pushed].double()
                    out["push"] = {
                        "queries": q, "pushed": int(report.pushed.sum()),
                        "work_per_nnz_median": round(float(work.median()) / nnz, 4)
                        if work.numel() else None,
                        "work_per_nnz_max": round(float(work.max()) / nnz, 4)
                        if work.numel() else None,
                        "touched_median": int(report.push_touched[report.pushed].median())
                        if work.numel() else None,
                        "max_bound": float(report.bound.max())}
    if "hipporag2" in tops and "hipporag2:chebyshev" in tops:
        a, b = tops["hipporag2"].passage_rows, tops["hipporag2:chebyshev"].passage_rows
        out["top10_same_as_iteration"] = round(float((a == b).all(dim=1).double().mean()), 4)
    if index.basis is not None:
        out["basis"] = {"seconds": round(index.basis.seconds, 2), "bytes": index.basis.nbytes,
                        "steps": index.basis.steps}
    out["peak_rss_gb"] = round(_peak_rss_gb(), 3)
    return out


def phase_prpack(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    import numpy as np
    import scipy.sparse as sp
    import torch

    from hippo_gpu.embed import Encoder
    from hippo_gpu.ppr import personalized_pagerank
    from hippo_gpu.versions.load import load_index

    try:
        import igraph as ig
    except ImportError:
        return {"skipped": "python-igraph is not installed"}
    k = args.prpack_queries if args.prpack_queries is not None else \
        (8 if args.size < 500_000 else 3)
    if k <= 0:
        return {"skipped": "--prpack-queries 0"}
    index = load_index(root / "index", device="cpu")
    queries = _queries(index, k, args.seed + 1)
    enc = Encoder(index.config.encoder, torch.device("cpu"))
    q_emb = enc.encode_queries([q for q, _ in queries], "query_to_passage")  # [Q, D]
    m, p, n = len(index.phrases), len(index.passage_keys), index.num_nodes
    reset = np.zeros((n, k))
    dense = (index.passage_emb @ q_emb.T).numpy().astype(np.float64)  # [P, Q]
    lo, hi = dense.min(0), dense.max(0)
    reset[m:] = 0.05 * (dense - lo) / np.where(hi > lo, hi - lo, 1.0)
    counts = index.phrase_passage_counts.numpy()
    for c, (_, j) in enumerate(queries):
        for ph in index.fact_phrases[j].tolist():
            reset[ph, c] += 1.0 / max(int(counts[ph]), 1)
    a = index.adjacency
    mat = sp.csr_matrix((a.values().double().numpy(), a.col_indices().numpy(),
                         a.crow_indices().numpy()), (n, n))
    t0 = time.perf_counter()
    upper = sp.triu(mat, k=1).tocoo()
    graph = ig.Graph(n=n, edges=np.stack([upper.row, upper.col], axis=1), directed=False)
    graph.es["weight"] = upper.data
    del upper, mat
    graph_s = time.perf_counter() - t0
    ms, ref = [], np.zeros((p, k))
    for c in range(k):
        t0 = time.perf_counter()
        x = graph.personalized_pagerank(vertices=None, damping=0.5, directed=False,
                                        weights="weight", reset=reset[:, c].tolist(),
                                        implementation="prpack")
        ms.append((time.perf_counter() - t0) * 1e3)
        ref[:, c] = np.asarray(x)[m:]
    seeds = torch.from_numpy(reset).float()
    t0 = time.perf_counter()
    ours = personalized_pagerank(index.adjacency, seeds)[m:].double().numpy()  # [P, Q]
    ours_ms = (time.perf_counter() - t0) * 1e3 / k
    top_ref = np.argsort(-ref, axis=0)[:10]
    top_ours = np.argsort(-ours, axis=0)[:10]
    agree = float(np.mean([len(set(top_ref[:, c]) & set(top_ours[:, c])) / 10
                           for c in range(k)]))
    return {"prpack_queries": k, "prpack_graph_s": round(graph_s, 2),
            "prpack_ms_per_query": round(float(np.median(ms)), 1),
            "ours_ms_per_query_batched": round(ours_ms, 1), "top10_agreement": round(agree, 3),
            "peak_rss_gb": round(_peak_rss_gb(), 3)}


PHASES = {"gen": phase_gen, "build": phase_build, "query": phase_query, "prpack": phase_prpack}


def run_child(args: argparse.Namespace) -> None:
    try:  # faiss's OpenMP pool (torch's threads and the thread variables: main's init_threads)
        import faiss

        faiss.omp_set_num_threads(args.threads)
    except ImportError:
        pass
    root = Path(args.work_dir) / f"p{args.size}"
    root.mkdir(parents=True, exist_ok=True)
    result = PHASES[args.child](args, root)
    Path(args.out_json).write_text(json.dumps(result))


# --- driver --------------------------------------------------------------------------------------


def _spawn(args: argparse.Namespace, phase: str, size: int) -> dict[str, Any]:
    out_json = Path(args.work_dir) / f"p{size}.{phase}.json"
    cmd = [sys.executable, "-m", "benchmarks.bench_scale", "--child", phase, "--size", str(size),
           "--out-json", str(out_json), "--threads", str(args.threads), "--device", args.device,
           "--encoder", args.encoder, "--knn-backend", args.knn_backend,
           "--batches", args.batches, "--modes", args.modes,
           "--repeats", str(args.repeats), "--work-dir", args.work_dir, "--seed", str(args.seed)]
    if args.prpack_queries is not None:
        cmd += ["--prpack-queries", str(args.prpack_queries)]
    print(f"[P={size}] {phase} ...", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, timeout=args.timeout, env=subprocess_env(args.threads))
    if proc.returncode != 0:
        raise RuntimeError(f"phase {phase} at P={size} failed with exit code {proc.returncode}")
    result = json.loads(out_json.read_text())
    result["wall_s"] = round(time.perf_counter() - t0, 2)
    return result


def _growth(prev: dict[str, Any] | None, row: dict[str, Any]) -> dict[str, float]:
    """Ratio per 10x passages: (b / a) ** (1 / log10(P_b / P_a)) for a few headline figures."""
    if prev is None:
        return {}
    decades = math.log10(row["passages"] / prev["passages"])
    if decades <= 0:
        return {}

    def per10(a: float | None, b: float | None) -> float | None:
        return round((b / a) ** (1 / decades), 2) if a and b else None

    out = {"build_s": per10(prev["build"]["build_s"], row["build"]["build_s"]),
           "build_peak_rss_gb": per10(prev["build"]["peak_rss_gb"], row["build"]["peak_rss_gb"]),
           "index_bytes": per10(prev["build"]["index_bytes"], row["build"]["index_bytes"]),
           "load_s": per10(prev["query"]["load_s"], row["query"]["load_s"])}
    for key, v in row["query"]["ms_per_query"].items():
        out[f"ms_per_query.{key}"] = per10(prev["query"]["ms_per_query"].get(key), v)
    return {k: v for k, v in out.items() if v is not None}


def _table(rows: list[dict[str, Any]], reference: dict[str, Any] | None) -> str:
    lines = [f"{'P':>9} {'build s':>8} {'build RSS GB':>12} {'disk MB':>8} {'B/psg':>6} "
             f"{'load s':>7} {'1st q s':>7} {'syn. kNN':>10} {'recall':>6} {'query RSS GB':>12}"]
    for r in rows:
        b, q = r["build"], r["query"]
        knn = b["synonym_knn"]
        lines.append(f"{r['passages']:>9} {b['build_s']:>8.1f} {b['peak_rss_gb']:>12.2f} "
                     f"{b['index_bytes'] / 1e6:>8.1f} {b['bytes_per_passage']:>6} "
                     f"{q['load_s']:>7.2f} {q['first_query_s']:>7.2f} "
                     f"{knn.get('backend', '-'):>10} "
                     f"{knn.get('recall_vs_exact', float('nan')):>6.3f} "
                     f"{q['peak_rss_gb']:>12.2f}")
    lines.append("")
    stages = list(dict.fromkeys(k for r in rows for k in r["build"]["stages_s"]))
    lines.append(f"{'P':>9} " + " ".join(f"{k.replace('embed_', 'emb_'):>14}" for k in stages)
                 + "   (build seconds per stage)")
    for r in rows:
        st = r["build"]["stages_s"]
        lines.append(f"{r['passages']:>9} " + " ".join(f"{st.get(k, 0.0):>14.1f}"
                                                     for k in stages))
    lines.append("")
    keys = list(rows[0]["query"]["ms_per_query"]) if rows else []
    lines.append(f"{'P':>9} " + " ".join(f"{k:>14}" for k in keys)
                 + f" {'prpack ms/q':>11} {'ours ms/q':>9} {'top10':>5}   (ms per query)")
    for r in rows:
        q, pr = r["query"], r.get("prpack", {})
        lines.append(f"{r['passages']:>9} " + " ".join(f"{q['ms_per_query'][k]:>14.2f}"
                                                     for k in keys)
                     + f" {pr.get('prpack_ms_per_query', '-'):>11} "
                     f"{pr.get('ours_ms_per_query_batched', '-'):>9} "
                     f"{pr.get('top10_agreement', '-'):>5}")
    lines.append("")
    for r in rows:
        if r.get("growth_per_10x"):
            lines.append(f"growth per 10x up to P={r['passages']}: "
                         + ", ".join(f"{k} {v}x" for k, v in r["growth_per_10x"].items()))
    if rows:
        gen = rows[-1]["gen"]["statistics"]
        lines.append("")
        lines.append(f"{'statistic':<30} {'synthetic':>10} {'musique_train':>14}")
        for k in (k for k in gen if k != "passages"):
            real = reference.get(k, "-") if reference else "-"
            lines.append(f"{k:<30} {gen[k]:>10} {real:>14}")
    return "\n".join(lines)


def _musique_statistics() -> dict[str, Any] | None:
    from hippo_gpu.data import read_corpus, read_openie
    from hippo_gpu.embed import HashEncoder
    from hippo_gpu.synthetic import corpus_statistics

    data = data_root() / "musique_train"
    if not (data / "corpus.json").exists():
        print(f"musique_train not found at {data}: no real statistics to compare")
        return None
    passages = read_corpus(data / "corpus.json")
    docs, _ = read_openie(data / "openie_gpt-3.5-turbo-1106.json", passages)
    return corpus_statistics(docs, embed=HashEncoder(64))


def main() -> int:
    args = _parse()
    init_threads(args.threads)  # each phase process sets its own, from the same --threads
    if args.child is not None:
        run_child(args)
        return 0
    if args.report:
        lines = [json.loads(x) for x in Path(args.results).read_text().splitlines() if x.strip()]
        latest = {r["passages"]: r for r in lines if r.get("bench") == "scale"}
        rows = [latest[p] for p in sorted(latest)]
        print(_table(rows, rows[-1].get("musique_statistics") if rows else None))
        return 0
    git = check_clean(args.allow_dirty)
    sizes = [int(s) for s in args.passages.split(",") if s]
    reference = _musique_statistics()
    rows: list[dict[str, Any]] = []
    prev = None
    for size in sizes:
        shutil.rmtree(Path(args.work_dir) / f"p{size}", ignore_errors=True)
        row: dict[str, Any] = {"passages": size}
        for phase in ("gen", "build", "query", "prpack"):
            row[phase] = _spawn(args, phase, size)
        row["peak_rss_gb"] = max(row[ph].get("peak_rss_gb", 0.0) for ph in PHASES)
        row["growth_per_10x"] = _growth(prev, row)
        record = {
            **provenance("scale", threads=args.threads, device=args.device,
                         encoder_backend=requested_backend(args.encoder), precision="float32",
                         query_precision="float32",
                         batch_sizes={"query_batch": [int(b) for b in args.batches.split(",")]},
                         optional_versions=("faiss", "igraph"), git=git),
            "encoder": args.encoder, "knn_backend": args.knn_backend, "seed": args.seed,
            "musique_statistics": reference, **row,
        }
        append_result(args.results, record, allow_dirty=args.allow_dirty)
        rows.append(row)
        prev = row
        if not args.keep:
            shutil.rmtree(Path(args.work_dir) / f"p{size}", ignore_errors=True)
        print(_table(rows, reference), flush=True)
    try:
        import matplotlib

        from benchmarks.plot import plot_scale, read_jsonl

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        print(plot_scale(plt, read_jsonl(Path(args.results)), Path(args.plot)))
    except ImportError as e:
        print(f"no plot ({e}); pip install 'hippo-gpu[plots]'")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
