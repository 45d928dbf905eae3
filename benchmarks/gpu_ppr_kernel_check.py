"""CUDA check of the Triton PPR step (kernels/src/ppr_triton.py) against cuSPARSE (the torch step).

On each graph (a musique-sized synthetic graph, N ≈ 18k, and the synthetic 1M-passage graph,
N ≈ 6M, nnz ≈ 58M) and float32 batch (Q = 32 and 128), prints per step: time of the torch step
(cuSPARSE addmm + residual + lerp) and of the fused Triton step, achieved GB/s counted from the
fewest bytes a step must move (each input read once, each output written once) against a
device-to-device copy measured in the same process, and their agreement (one step, and a full
certified Chebyshev solve per backend against each other; on the small graph also against a
float64 CPU solve). Then the fixed-step loop (14 Chebyshev steps, no residual) captured in a CUDA
graph for both. Appends one JSON line to benchmarks/results/gpu_ppr_kernel_check.jsonl.

    python -m benchmarks.gpu_ppr_kernel_check            # < 2 minutes on one H100/H200
    python -m benchmarks.gpu_ppr_kernel_check --passages 1000000 --batch-sizes 32,128

Exits with status 2 printing SKIP when no CUDA device (or no Triton) is present.
``--dry-run`` runs the same code on the CPU with TRITON_INTERPRET=1 and tiny graphs (a check of
this script, not a measurement).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import sys
import time
import types
import warnings
from pathlib import Path

import torch

from benchmarks.common import REPO, RESULTS, git_state, time_call

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/ppr", "kernels/src")

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")


def _import_ppr_modules():
    """hippo_gpu.ppr / synthetic / kernels without hippo_gpu/__init__ (its index, encoder and
    faiss imports are not needed here and may be absent on a bare GPU box)."""
    if "hippo_gpu" not in sys.modules:
        pkg = types.ModuleType("hippo_gpu")
        pkg.__path__ = [str(REPO / "hippo_gpu")]
        sys.modules["hippo_gpu"] = pkg
        spec = importlib.util.spec_from_file_location(
            "hippo_gpu.kernels", REPO / "kernels" / "src" / "__init__.py",
            submodule_search_locations=[str(REPO / "kernels" / "src")],
        )
        kernels = importlib.util.module_from_spec(spec)
        sys.modules["hippo_gpu.kernels"] = kernels
        spec.loader.exec_module(kernels)
    import hippo_gpu.ppr as ppr
    import hippo_gpu.synthetic as synthetic

    return ppr, synthetic


DEVICE = "cuda"


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth(gib: float = 2.0) -> float:
    """Device-to-device copy, bytes read + written per second."""
    n = int(gib * (1 << 30)) // 4
    src = torch.rand(n, device=DEVICE)
    dst = torch.empty_like(src)
    seconds = time_call(lambda: dst.copy_(src), device=DEVICE, warmup=2, repeats=10,
                        events=True).median
    return 2 * n * 4 / seconds


def step_bytes(nnz: int, n: int, q: int, itemsize: int, index_bytes: int) -> int:
    """Fewest bytes of one step: M (values + column indices + row pointers) once; y, base,
    y_prev read once; g and y_prev written once."""
    return nnz * (itemsize + index_bytes) + (n + 1) * index_bytes + 5 * n * q * itemsize


def check_graph(ppr, name, adjacency, reset, batch_sizes, bandwidth, triton_step, rows, args):
    n = adjacency.shape[0]
    nnz = adjacency.values().numel()
    start = time.perf_counter()
    transition = ppr.build_transition(adjacency, dtype=torch.float32, device=DEVICE)
    build_s = time.perf_counter() - start
    index_bytes = transition.matrix.col_indices().element_size()
    matrix, d = transition.matrix, transition.damping
    ref64 = None
    if n <= 50_000:  # float64 CPU reference of the whole batch
        ref64 = ppr.ppr_solve(ppr.build_transition(adjacency, dtype=torch.float64),
                              reset, tol=1e-12).scores
    for q in batch_sizes:
        r_hat = (reset[:, :q] / reset[:, :q].sum(0)).to(DEVICE, torch.float32)
        base = r_hat * (1 - d)
        y = r_hat + 1e-4 * torch.rand_like(r_hat)  # a generic iterate, not the seed itself
        prev = r_hat.clone()
        out = {}
        for label, step in (("cusparse", ppr.torch_step(transition)),
                            ("triton", triton_step(matrix, d))):
            g = torch.empty_like(y)
            p = prev.clone()
            measured = step(base, y, p, g, 1.2, True)
            out[label] = (g.clone(), p.clone(), measured[0].clone(), measured[1].clone())
            p2 = prev.clone()
            seconds = time_call(
                lambda step=step, g=g, p2=p2, base=base, y=y: step(base, y, p2, g, 1.2, True),
                device=DEVICE, warmup=2, repeats=args.repeats, events=True).median
            moved = step_bytes(nnz, n, q, 4, index_bytes)
            rows.append({
                "graph": name, "N": n, "nnz": nnz, "Q": q, "backend": label, "dtype": "float32",
                "step_ms": round(seconds * 1e3, 4),
                "us_per_query_step": round(seconds * 1e6 / q, 3),
                "gbs": round(moved / seconds / 1e9, 1),
                "bw_frac": round(moved / seconds / bandwidth, 3), "build_s": round(build_s, 2),
            })
        diffs = [float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                 for a, b in zip(out["triton"], out["cusparse"])]
        rows[-1]["step_rel_diff_g_prev_res_mass"] = [f"{x:.1e}" for x in diffs]
        # full certified solves (float32, default tol) with each step function
        solves = {}
        for label, fn in (("cusparse", None), ("triton", triton_step(matrix, d))):
            result = ppr.ppr_solve(transition, r_hat, normalised=True, step=fn)
            _sync()
            seconds = time_call(lambda fn=fn, r_hat=r_hat: ppr.ppr_solve(
                transition, r_hat, normalised=True, step=fn), device=DEVICE, warmup=0,
                repeats=3, events=True).median
            solves[label] = result
            row = next(r for r in rows[::-1] if r["backend"] == label and r["Q"] == q
                       and r["graph"] == name)
            row["solve_ms_per_query"] = round(seconds * 1e3 / q, 4)
            row["solve_steps"] = int(result.iterations.max())
            row["solve_bound_max"] = float(result.error_bound.max())
            if ref64 is not None:
                row["max_abs_vs_float64"] = float(
                    (result.scores.double().cpu() - ref64[:, :q]).abs().max())
        rows[-1]["solve_max_abs_triton_vs_cusparse"] = float(
            (solves["triton"].scores - solves["cusparse"].scores).abs().max())
        # fixed-step loop in a CUDA graph (no residual, no host sync): replay time per step
        weights = ppr.chebyshev_weights(d, args.graph_steps)
        for label, fn in (("cusparse", ppr.torch_step(transition)),
                          ("triton", triton_step(matrix, d))):
            ys = [r_hat.clone(), r_hat.clone()]
            g = torch.empty_like(r_hat)

            def loop(fn=fn, ys=ys, g=g, base=base, weights=weights):
                a, b = ys
                for w in weights:
                    fn(base, a, b, g, w, False)
                    a, b = b, a

            try:
                loop()  # compile / warm up outside capture
                _sync()
                if DEVICE == "cuda":
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        loop()
                    seconds = time_call(graph.replay, device=DEVICE, warmup=0, repeats=5,
                                        events=True).median
                else:
                    seconds = time_call(loop, warmup=0, repeats=1).median
                note = None
            except RuntimeError as e:  # report, do not hide: capture may be unsupported
                seconds, note = float("nan"), f"capture failed: {e}"[:200]
            row = next(r for r in rows[::-1] if r["backend"] == label and r["Q"] == q
                       and r["graph"] == name)
            row["graph_us_per_query_step"] = round(seconds * 1e6 / (q * len(weights)), 3)
            if note:
                row["graph_note"] = note


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--passages", type=int, default=1_000_000, help="large synthetic graph P")
    ap.add_argument("--small-passages", type=int, default=3_000, help="musique-sized (N ≈ 18k)")
    ap.add_argument("--batch-sizes", default="32,128")
    ap.add_argument("--repeats", type=int, default=10, help="timed calls per single step")
    ap.add_argument("--graph-steps", type=int, default=14)
    ap.add_argument("--results", default=str(RESULTS / "gpu_ppr_kernel_check.jsonl"))
    ap.add_argument("--dry-run", action="store_true", help="CPU + TRITON_INTERPRET, tiny sizes")
    ap.add_argument("--tests", action="store_true",
                    help="run the CUDA tests of tests/ppr/test_ppr.py and "
                         "tests/ppr/test_kernels.py instead (imports as here, so no "
                         "encoder/faiss packages are needed)")
    args = ap.parse_args()
    if args.tests:
        import pytest

        _import_ppr_modules()
        return pytest.main(["-q", "-p", "no:cacheprovider", "-k", "cuda and not igraph",
                            str(REPO / "tests" / "ppr" / "test_ppr.py"),
                            str(REPO / "tests" / "ppr" / "test_kernels.py")])
    global DEVICE
    if args.dry_run:
        import os

        os.environ["TRITON_INTERPRET"] = "1"
        DEVICE = "cpu"
        args.passages, args.small_passages, args.repeats, args.graph_steps = 12, 8, 1, 2
        args.batch_sizes = "3"
    elif not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 2
    if importlib.util.find_spec("triton") is None:
        print("SKIP: triton is not installed")
        return 2
    ppr, synthetic = _import_ppr_modules()
    from hippo_gpu.kernels import ppr_triton

    t0 = time.perf_counter()
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    bandwidth = copy_bandwidth(2.0 if DEVICE == "cuda" else 0.01)
    device_name = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu (dry run)"
    print(f"{device_name}: device copy {bandwidth / 1e9:.0f} GB/s "
          f"(torch {torch.__version__}, triton {importlib.import_module('triton').__version__})")
    rows: list[dict] = []
    qmax = max(batch_sizes)

    def step_factory(matrix, d):
        return ppr_triton.make_step(matrix, d)

    for name, passages in (("synthetic-musique-size", args.small_passages),
                           ("synthetic-1M", args.passages)):
        start = time.perf_counter()
        graph = synthetic.synthetic_graph(passages, seed=0)
        reset = synthetic.synthetic_reset_vectors(graph, qmax, seed=1)
        print(f"{name}: P={passages} N={graph.num_nodes} generated in "
              f"{time.perf_counter() - start:.1f}s", flush=True)
        check_graph(ppr, name, graph.adjacency, reset, batch_sizes, bandwidth, step_factory,
                    rows, args)
        del graph, reset
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    print(f"\n{'graph':<24} {'Q':>4} {'backend':<9} {'step ms':>9} {'us/q/step':>10} "
          f"{'GB/s':>7} {'of copy':>8} {'graph us/q/step':>16} {'solve ms/q':>11} {'steps':>6}")
    for r in rows:
        print(f"{r['graph']:<24} {r['Q']:>4} {r['backend']:<9} {r['step_ms']:>9.3f} "
              f"{r['us_per_query_step']:>10.3f} {r['gbs']:>7.1f} {r['bw_frac']:>8.3f} "
              f"{r.get('graph_us_per_query_step', float('nan')):>16.3f} "
              f"{r.get('solve_ms_per_query', float('nan')):>11.4f} {r.get('solve_steps', 0):>6}")
    for r in rows:
        keys = ("step_rel", "solve_max", "max_abs", "graph_n")
        extra = {k: r[k] for k in r if k.startswith(keys)}
        if extra:
            print(f"  {r['graph']} Q={r['Q']} {r['backend']}: {extra}")
    record = {
        "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        **{k: v for k, v in git_state().items() if k in ("commit", "dirty")},
        "device": device_name,
        "versions": {"torch": torch.__version__,
                     "triton": importlib.import_module("triton").__version__},
        "copy_bandwidth_gbs": round(bandwidth / 1e9, 1),
        "batch_sizes": batch_sizes,
        "rows": rows,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    if args.dry_run:
        return 0
    path = Path(args.results)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
    print(f"appended to {path} ({record['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
