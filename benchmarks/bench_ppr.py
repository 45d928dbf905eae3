"""PPR benchmark: igraph prpack (as official HippoRAG calls it) vs scipy vs networkx vs hippo_gpu.

All providers run in one process on the same graph and the same reset vectors. Printed per row:
ms per query (median, p20-p80), speed-up vs prpack, max |diff| vs the float64 reference at the
passage rows, top-10 passage agreement (fraction of queries whose top-10 set equals the
reference's), iterations, and on CUDA the achieved GB/s vs a device-to-device copy measured in the
same process. Each run appends one JSON line to benchmarks/results/bench_ppr.jsonl.

    python benchmarks/bench_ppr.py --graph synthetic --passages 100000 --threads 1
    python benchmarks/bench_ppr.py --graph musique --threads 1
"""

from __future__ import annotations

import argparse
import os
import sys


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--graph", choices=["synthetic", "musique"], default="synthetic")
    ap.add_argument("--passages", type=int, default=100_000, help="synthetic graph size P")
    ap.add_argument("--queries", type=int, default=128, help="reset vectors (synthetic)")
    ap.add_argument("--batch-sizes", default="1,8,32,128")
    ap.add_argument("--threads", type=int, required=True, help="torch + OpenMP/BLAS threads")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or 'cpu,cuda'")
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument(
        "--methods", default="auto", help="comma list of iterate, rcm, closed_form, auto"
    )
    ap.add_argument("--prpack-queries", type=int, default=None, help="default by N: all/8/3")
    ap.add_argument("--scipy-queries", type=int, default=8)
    ap.add_argument("--networkx-max-nodes", type=int, default=30_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-seconds", type=float, default=20.0, help="per timed row")
    ap.add_argument("--index-dir", default="/tmp/hippo_gpu_musique_index")
    ap.add_argument("--data-dir", default=None, help="default $HIPPO_DATA_DIR or ../shared/data")
    ap.add_argument("--bandwidth", action="store_true", help="measure CUDA copy bandwidth")
    ap.add_argument("--results", default=None, help="JSONL path (default results/bench_ppr.jsonl)")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:  # thread env for OpenMP/BLAS must be set before numpy/torch/igraph load
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)

import datetime as dt  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import scipy  # noqa: E402
import scipy.sparse as sp  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from timing import Timing, time_call  # noqa: E402

from hippo_gpu.ppr import PPRSolver  # noqa: E402

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
REPO = Path(__file__).resolve().parents[1]
TOP_K = 10


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def load_graph(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """(adjacency CSR [N, N], passage rows [P], reset vectors [N, Q] float64, description)."""
    if args.graph == "synthetic":
        from hippo_gpu.synthetic import synthetic_graph, synthetic_reset_vectors

        start = time.perf_counter()
        graph = synthetic_graph(args.passages, seed=args.seed)
        reset = synthetic_reset_vectors(graph, args.queries, seed=args.seed + 1)
        info = {"graph": "synthetic", "passages": args.passages, "seed": args.seed}
        info["generate_s"] = round(time.perf_counter() - start, 2)
        return graph.adjacency, graph.passage_nodes, reset, info
    # musique_train: the lead's index API (hippo_gpu.build_index / load_index / search).
    import hippo_gpu
    from hippo_gpu.search import Searcher

    data = Path(args.data_dir or os.environ.get("HIPPO_DATA_DIR", REPO.parent / "shared" / "data"))
    sub = data / "musique_train"
    index_dir = Path(args.index_dir)
    if (index_dir / "config.json").exists() or any(index_dir.glob("*")):
        index = hippo_gpu.load_index(index_dir)
    else:
        index = hippo_gpu.build_index(
            sub / "corpus.json", sub / "openie_gpt-3.5-turbo-1106.json", index_dir
        )
    questions = json.loads((sub / "questions.json").read_text())
    texts = [q["question"] for q in questions]
    reset = Searcher(index).hipporag2_reset_vectors(texts).to(torch.float64)
    info = {"graph": "musique_train", "passages": int(index.passage_nodes.numel())}
    return index.adjacency, index.passage_nodes.to(torch.int64), reset.cpu(), info


def topk_sets(scores: np.ndarray, k: int = TOP_K) -> list[set[int]]:
    """Top-k row sets per column of [P, Q] scores."""
    k = min(k, scores.shape[0])
    idx = np.argpartition(-scores, k - 1, axis=0)[:k]
    return [set(idx[:, j].tolist()) for j in range(scores.shape[1])]


def quality(scores: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(max |diff|, fraction of queries with identical top-10 sets) vs the reference [P, Q]."""
    a, b = topk_sets(scores), topk_sets(ref[:, : scores.shape[1]])
    agree = float(np.mean([x == y for x, y in zip(a, b, strict=True)]))
    return float(np.abs(scores - ref[:, : scores.shape[1]]).max()), agree


def prpack_rows(adjacency: torch.Tensor, reset: np.ndarray, passages: np.ndarray, k: int):
    """Official-style igraph call per query; returns (Timing per query, scores [P, k])."""
    import igraph as ig

    a = adjacency.to("cpu")
    n = a.shape[0]
    m = sp.csr_matrix(
        (a.values().double().numpy(), a.col_indices().numpy(), a.crow_indices().numpy()), (n, n)
    )
    upper = sp.triu(m, k=1).tocoo()  # one undirected edge per pair, weight = A[u, v]
    graph = ig.Graph(n=n, edges=np.stack([upper.row, upper.col], axis=1).tolist(), directed=False)
    graph.es["weight"] = upper.data.tolist()
    out = np.empty((passages.size, k))
    samples = []
    for q in range(k):
        start = time.perf_counter()
        x = graph.personalized_pagerank(
            vertices=range(n),
            damping=0.5,
            directed=False,
            weights="weight",
            reset=reset[:, q],
            implementation="prpack",
        )
        samples.append(time.perf_counter() - start)
        out[:, q] = np.asarray(x)[passages]
    samples.sort()
    med = float(np.median(samples))
    timing = Timing(
        samples[0], med, float(np.quantile(samples, 0.2)), float(np.quantile(samples, 0.8)), k
    )
    return timing, out


def scipy_power(m_t: sp.csr_matrix, dangling: np.ndarray, reset: np.ndarray, tol: float = 1e-11):
    """Textbook float64 power iteration on x = (1-d) r̂ + d Mx + d (δᵀx) r̂ for a batch [N, Q]."""
    r_hat = reset / reset.sum(axis=0, keepdims=True)
    x = r_hat.copy()
    for _ in range(1000):
        new = 0.5 * (m_t @ x) + (0.5 + 0.5 * (dangling @ x))[None, :] * r_hat
        done = np.abs(new - x).sum(axis=0).max() <= tol
        x = new
        if done:
            break
    return x


def networkx_rows(adjacency: torch.Tensor, reset: np.ndarray, passages: np.ndarray, k: int):
    import networkx as nx

    a = adjacency.to("cpu")
    n = a.shape[0]
    m = sp.csr_matrix(
        (a.values().double().numpy(), a.col_indices().numpy(), a.crow_indices().numpy()), (n, n)
    )
    graph = nx.from_scipy_sparse_array(m)  # undirected, 'weight' attribute
    out = np.empty((passages.size, k))

    def run() -> None:
        for q in range(k):
            pers = {i: float(v) for i, v in enumerate(reset[:, q]) if v > 0}
            x = nx.pagerank(graph, alpha=0.5, personalization=pers, weight="weight", tol=1e-12)
            out[:, q] = np.array([x[i] for i in range(n)])[passages]

    timing = time_call(run, warmup=0, repeats=1)
    return timing, out


def copy_bandwidth_gbs(device: torch.device, gib: float = 4.0) -> float:
    """Device-to-device copy bandwidth (read + write bytes / s) in the current process."""
    n = int(gib * (1 << 30)) // 4
    src = torch.empty(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    timing = time_call(lambda: dst.copy_(src), device=device, warmup=2, repeats=10)  # noqa: F821
    del src, dst
    return 2 * n * 4 / timing.median / 1e9


def iterate_bytes(nnz: int, n: int, q: int, itemsize: int) -> int:
    """Bytes one PPR step must move at least: M (values + int32 cols + rows), read y, write y'."""
    return nnz * (itemsize + 4) + 4 * (n + 1) + 3 * n * q * itemsize


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def hardware(devices: list[str]) -> dict:
    info = {"cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if "cuda" in devices and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def versions(optional: tuple[str, ...] = ("igraph", "networkx")) -> dict:
    """Python, torch, numpy, scipy versions, plus each optional module's (None if absent)."""
    out = {"python": platform.python_version(), "torch": torch.__version__}
    out.update(numpy=np.__version__, scipy=scipy.__version__)
    for name in optional:
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            out[name] = None
    return out


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.threads)
    except ImportError:
        pass
    devices = [d for d in args.device.split(",") if d]
    if "cuda" in devices and not torch.cuda.is_available():
        print("CUDA requested but not available: CPU only")
        devices = [d for d in devices if d != "cuda"]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    dtypes = {"float32": torch.float32, "float64": torch.float64}
    adjacency, passages_t, reset_t, info = load_graph(args)
    n, nnz = int(adjacency.shape[0]), int(adjacency.values().numel())
    q_total = int(reset_t.shape[1])
    batch_sizes = [b for b in batch_sizes if b <= q_total]
    passages = passages_t.numpy()
    reset = reset_t.numpy()
    print(
        f"graph={info['graph']} N={n} nnz={nnz} P={passages.size} Q={q_total} "
        f"threads={args.threads} torch_threads={torch.get_num_threads()} devices={devices}"
    )

    # Reference: float64, tight tolerance, all queries (our solver; prpack diff printed below).
    start = time.perf_counter()
    ref_solver = PPRSolver(
        adjacency,
        target_nodes=passages_t,
        dtype=torch.float64,
        device=devices[-1],
        method="iterate",
        tol=1e-12,
    )
    ref = ref_solver(reset_t).cpu().numpy()  # [P, Q]
    del ref_solver
    print(f"float64 reference: {time.perf_counter() - start:.1f}s")

    rows: list[dict] = []

    def add(provider: str, dtype: str, device: str, q: int, timing: Timing, scores, **extra):
        diff, agree = quality(scores, ref)
        row = {
            "provider": provider,
            "dtype": dtype,
            "device": device,
            "Q": q,
            "ms_per_query": timing.median * 1e3 / q,
            "p20_ms_per_query": timing.p20 * 1e3 / q,
            "p80_ms_per_query": timing.p80 * 1e3 / q,
            "first_call_ms": timing.first * 1e3,
            "runs": timing.runs,
            "max_abs_diff": diff,
            "top10_agreement": agree,
        }
        row.update(extra)
        rows.append(row)
        print(
            f"  {provider:<24} {dtype:<8} {device:<5} Q={q:<4} "
            f"{row['ms_per_query']:10.3f} ms/q  diff={diff:.2e} top10={agree:.3f}"
            + "".join(f" {k}={v}" for k, v in extra.items())
        )

    k_pr = args.prpack_queries or (q_total if n <= 100_000 else 8 if n <= 1_000_000 else 3)
    k_pr = min(k_pr, q_total)
    prpack_ms = float("nan")  # speed-ups are NaN when igraph is absent (e.g. an offline GPU box)
    if k_pr > 0 and importlib.util.find_spec("igraph") is not None:
        pr_timing, pr_scores = prpack_rows(adjacency, reset, passages, k_pr)
        add("igraph-prpack", "float64", "cpu", 1, pr_timing, pr_scores, queries_timed=k_pr)
        prpack_ms = pr_timing.median * 1e3
    else:
        print("  igraph-prpack skipped (--prpack-queries 0 or python-igraph missing)")

    # scipy CSR power iteration, batched like ours (float64).
    a = adjacency.to("cpu")
    m = sp.csr_matrix(
        (a.values().double().numpy(), a.col_indices().numpy(), a.crow_indices().numpy()), (n, n)
    )
    degree = np.asarray(m.sum(axis=1)).ravel()
    inv = np.divide(1.0, degree, out=np.zeros_like(degree), where=degree > 0)
    m_t = (m @ sp.diags(inv)).tocsr()  # A D⁻¹
    dangling = (degree <= 0).astype(np.float64)
    for q in sorted({min(1, args.scipy_queries), min(args.scipy_queries, q_total)} - {0}):
        sub = reset[:, :q]
        holder: dict = {}
        timing = time_call(
            lambda sub=sub, holder=holder: holder.update(x=scipy_power(m_t, dangling, sub)),
            warmup=0,
            repeats=2,
            max_seconds=args.max_seconds,
        )
        add("scipy-power", "float64", "cpu", q, timing, holder["x"][passages])

    if n <= args.networkx_max_nodes:
        k_nx = min(3, q_total)
        timing, scores = networkx_rows(adjacency, reset, passages, k_nx)
        timing = Timing(
            timing.first / k_nx, timing.median / k_nx, timing.p20 / k_nx, timing.p80 / k_nx, k_nx
        )
        add("networkx", "float64", "cpu", 1, timing, scores)

    methods = [m.strip() for m in args.methods.split(",")]
    bandwidth: dict[str, float] = {}
    for device in devices:
        dev = torch.device(device)
        if dev.type == "cuda" and args.bandwidth:
            bandwidth[device] = copy_bandwidth_gbs(dev)
            print(f"  {device} device-to-device copy: {bandwidth[device]:.0f} GB/s")
        for dname in args.dtypes.split(","):
            dtype = dtypes[dname]
            for method in methods:
                kwargs = {"method": method}
                if method == "rcm":
                    kwargs = {"method": "iterate", "reorder": True}
                start = time.perf_counter()
                try:
                    solver = PPRSolver(
                        adjacency, target_nodes=passages_t, dtype=dtype, device=dev, **kwargs
                    )
                except ValueError as e:  # closed form over its memory budget
                    print(f"  {method} skipped: {e}")
                    continue
                build_s = time.perf_counter() - start
                label = f"hippo_gpu-{solver.method}" + ("-rcm" if kwargs.get("reorder") else "")
                for q in batch_sizes:
                    seeds = reset_t[:, :q].to(device=dev, dtype=dtype)
                    holder = {}
                    timing = time_call(
                        lambda seeds=seeds, holder=holder, solver=solver: holder.update(
                            x=solver(seeds)
                        ),
                        device=dev,
                        repeats=args.repeats,
                        max_seconds=args.max_seconds,
                    )
                    extra = {"iters": solver.last_iterations, "build_s": round(build_s, 2)}
                    if dev.type == "cuda" and solver.method == "iterate" and solver.last_iterations:
                        moved = iterate_bytes(nnz, n, q, torch.finfo(dtype).bits // 8)
                        gbs = moved * solver.last_iterations / timing.median / 1e9
                        extra["gbs"] = round(gbs, 1)
                        if device in bandwidth:
                            extra["bw_frac"] = round(gbs / bandwidth[device], 3)
                    extra["speedup"] = round(prpack_ms / (timing.median * 1e3 / q), 1)
                    add(
                        label, dname, device, q, timing, holder["x"].double().cpu().numpy(), **extra
                    )
                del solver
                if dev.type == "cuda":
                    torch.cuda.empty_cache()

    for row in rows:
        row.setdefault("speedup", round(prpack_ms / row["ms_per_query"], 2))
    print(
        f"\n{'provider':<24} {'dtype':<8} {'dev':<5} {'Q':>4} {'ms/query':>10} "
        f"{'p20-p80':>17} {'x prpack':>9} {'max|diff|':>9} {'top10':>6}"
    )
    for r in rows:
        print(
            f"{r['provider']:<24} {r['dtype']:<8} {r['device']:<5} {r['Q']:>4} "
            f"{r['ms_per_query']:>10.3f} "
            f"{r['p20_ms_per_query']:>8.3f}-{r['p80_ms_per_query']:<8.3f}"
            f" {r['speedup']:>9.1f} {r['max_abs_diff']:>9.1e} {r['top10_agreement']:>6.3f}"
        )
    record = {
        "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "hardware": hardware(devices),
        "threads": args.threads,
        "torch_threads": torch.get_num_threads(),
        "versions": versions(),
        **info,
        "N": n,
        "nnz": nnz,
        "Q_total": q_total,
        "batch_sizes": batch_sizes,
        "copy_bandwidth_gbs": bandwidth,
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "rows": rows,
    }
    print(f"peak RSS: {record['peak_rss_mb']:.0f} MB")
    path = (
        Path(args.results) if args.results else REPO / "benchmarks" / "results" / "bench_ppr.jsonl"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
    print(f"appended to {path}")


if __name__ == "__main__":
    main(ARGS)
