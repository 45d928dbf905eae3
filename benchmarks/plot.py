"""Plots of the benchmark results lines (benchmarks/results/*.jsonl) as PNGs under docs/.

    python -m benchmarks.plot                      # every plot the results support
    python -m benchmarks.plot --eval-json FILE     # recall@k curves from `hippo-gpu eval --json`
    python -m benchmarks.plot --run-eval ../shared/data/musique_train --eval-json FILE
                                                   # run that eval first (writes FILE), then plot

Without --eval-json, docs/recall_eval.json is used when it exists (the eval behind the committed
docs/recall.png, written by `--run-eval DATA --eval-json docs/recall_eval.json`, which adds the
commit, machine and versions to the eval's JSON).

Writes (each only when the results hold the rows it needs; a skipped plot is reported):
    docs/ppr_batch.png       PPR ms/query vs batch size Q, one panel per graph (the latest run of
                             each graph and thread count), every provider and dtype of that run;
                             igraph prpack (one query at a time) as a dashed line
    docs/ppr_graph_size.png  PPR ms/query vs graph size (nodes): prpack vs ours at one batch size
                             (--graph-batch, default 8), runs with one thread count (--threads)
    docs/recall.png          recall@k vs k for dense, hipporag2 and hybrid, from the source with
                             the most k values: --eval-json, bench_precision.jsonl (float32
                             rows) or tune_hybrid.jsonl (all questions)
    docs/server.png          server QPS and p99 latency vs concurrent clients (bench_server.jsonl)

Every figure's title names the machine (CPU model or architecture, cores, GPU), the threads and
the commit(s) of the rows it draws, "+dirty" where a row was recorded on a dirty tree. Results
files are read as they are: bench_ppr.jsonl's schema is growing, so a row or run that lacks a
field a plot needs is skipped (and counted), never guessed.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, RESULTS, provenance

RECALL_MODES = ("dense", "hipporag2", "hybrid")
# The eval output behind docs/recall.png (written by --run-eval; read by default when present).
EVAL_JSON = REPO / "docs" / "recall_eval.json"
MODE_COLORS = {"dense": "tab:gray", "hipporag2": "tab:blue", "hybrid": "tab:green"}


# ---------------------------------------------------------------------------------------------
# reading


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a results file; unparsable or non-object lines are skipped."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            out.append(row)
    return out


def number(x: Any) -> float | None:
    """x as a finite float, else None (missing, null, NaN, a string...)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def when(row: dict[str, Any]) -> str:
    return str(row.get("time") or row.get("when") or "")


def machine(rows: Iterable[dict[str, Any]]) -> str:
    """'Intel(R) Xeon(R) Processor, 2 cores' (+ GPU name) from the rows' hardware fields."""
    names = []
    for row in rows:
        hw = row.get("hardware") or {}
        if not isinstance(hw, dict):
            hw = {}
        cpu = hw.get("cpu") or hw.get("cpu_model") or row.get("cpu") or row.get("cpu_model") \
            or hw.get("processor") or hw.get("machine")
        cores = hw.get("cpu_count") or row.get("cpu_count")
        if not cpu and not cores:
            name = "machine not recorded"
        else:
            name = f"{cpu or 'CPU?'}, {cores} cores" if cores else str(cpu)
        if hw.get("gpu"):
            name += f", {hw['gpu']}"
        if name not in names:
            names.append(name)
    return " / ".join(names) or "machine not recorded"


def commits(rows: Iterable[dict[str, Any]]) -> str:
    out = []
    for row in rows:
        c = row.get("commit")
        tag = (c[:8] if isinstance(c, str) and c else "not recorded") + (
            "+dirty" if row.get("dirty") else "")
        if tag not in out:
            out.append(tag)
    return ", ".join(out) or "commit not recorded"


def threads_of(row: dict[str, Any]) -> Any:
    t = row.get("threads")
    if t is None and isinstance(row.get("config"), dict):
        t = row["config"].get("threads")
    return t if t is not None else "default"


def threads_label(rows: Iterable[dict[str, Any]]) -> str:
    return ", ".join(sorted({str(threads_of(r)) for r in rows}))


def provenance_line(rows: Sequence[dict[str, Any]]) -> str:
    return (f"{machine(rows)}; threads {threads_label(rows)}; commit {commits(rows)}")


# ---------------------------------------------------------------------------------------------
# PPR


def ppr_runs(rows: list[dict[str, Any]], skipped: dict[str, int]) -> list[dict[str, Any]]:
    """Runs with the fields both PPR plots need; their rows filtered to usable ones."""
    runs = []
    for run in rows:
        nodes = number(run.get("N"))
        if nodes is None or not isinstance(run.get("rows"), list):
            skipped["ppr runs without N or rows"] += 1
            continue
        good = []
        for r in run["rows"]:
            if (isinstance(r, dict) and isinstance(r.get("provider"), str)
                    and number(r.get("Q")) is not None and number(r.get("ms_per_query"))):
                good.append(r)
            else:
                skipped["ppr rows without provider, Q or ms_per_query"] += 1
        if good:
            runs.append({**run, "rows": good})
    return runs


def is_prpack(provider: str) -> bool:
    return "prpack" in provider


def is_ours(provider: str) -> bool:
    return provider.startswith("hippo_gpu")


def pick_latest(runs: Iterable[dict[str, Any]], key: Any) -> list[dict[str, Any]]:
    """One run per key(run): a clean run over a dirty one (or one of unknown state), then the
    newest."""
    best: dict[Any, dict[str, Any]] = {}
    for run in runs:
        k = key(run)
        rank = (run.get("dirty") is not True, when(run))
        if k not in best or rank >= (best[k].get("dirty") is not True, when(best[k])):
            best[k] = run
    return list(best.values())


def style(name: str) -> dict[str, Any]:
    """float64 series dashed, others solid: the dtype is read off the series name."""
    return {"linestyle": "--" if "float64" in name else "-"}


def plain_log2_axis(ax: Any, values: Iterable[float]) -> None:
    """Log2 x axis labelled with the measured values themselves (1, 8, 32, ...)."""
    ticks = sorted({int(v) for v in values})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.minorticks_off()


def series_name(r: dict[str, Any]) -> str:
    dev = r.get("device")
    return f"{r['provider']} {r.get('dtype', '?')}" + (f" {dev}" if dev and dev != "cpu" else "")


def graph_label(run: dict[str, Any]) -> str:
    graph = run.get("graph", "graph")
    p = number(run.get("passages"))
    size = f"{int(p):,} passages, " if p else ""
    nnz = number(run.get("nnz"))
    return f"{graph}: {size}N {int(run['N']):,}" + (f", nnz {int(nnz):,}" if nnz else "")


def plot_ppr_batch(plt: Any, runs: list[dict[str, Any]], out: Path) -> str:
    chosen = sorted(
        pick_latest(runs, lambda r: (r.get("graph"), r["N"], threads_of(r),
                                     r.get("device") or "cpu")),
        key=lambda r: (r["N"], str(threads_of(r))))
    if not chosen:
        return "skipped: no PPR run with timings"
    cols = min(2, len(chosen))
    nrows = math.ceil(len(chosen) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(7.5 * cols, 4.8 * nrows), squeeze=False)
    for ax, run in zip(axes.flat, chosen):
        by_series: dict[str, list[tuple[float, float]]] = defaultdict(list)
        prpack = []
        for r in run["rows"]:
            if is_prpack(r["provider"]):
                prpack.append(float(r["ms_per_query"]))
            else:
                by_series[series_name(r)].append((float(r["Q"]), float(r["ms_per_query"])))
        for name, pts in sorted(by_series.items()):
            pts.sort()
            ax.plot([q for q, _ in pts], [m for _, m in pts], marker="o", label=name,
                    **style(name))
        if prpack:
            ax.axhline(min(prpack), color="black", linestyle=":", linewidth=2,
                       label=f"igraph prpack, 1 query: {min(prpack):.3g} ms")
        plain_log2_axis(ax, [float(r["Q"]) for r in run["rows"]])
        ax.set_yscale("log")
        ax.set_xlabel("queries per batch (Q)")
        ax.set_ylabel("ms per query (median)")
        ax.set_title(f"{graph_label(run)}\n{machine([run])}; threads {threads_of(run)}; "
                     f"commit {commits([run])}, {when(run)[:10]}", fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(chosen):]:
        ax.set_visible(False)
    fig.suptitle("Personalized PageRank: ms/query vs batch size Q (lower is better; "
                 "dashed: float64)\nthe latest clean run per graph and thread count",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return f"{len(chosen)} runs"


def plot_ppr_graph_size(plt: Any, runs: list[dict[str, Any]], out: Path, *, batch: int,
                        threads: int) -> str:
    runs = [r for r in runs if threads_of(r) == threads]
    chosen = sorted(pick_latest(runs, lambda r: (r.get("graph"), r["N"],
                                                  r.get("device") or "cpu")),
                    key=lambda r: r["N"])
    ours: dict[str, list[tuple[float, float]]] = defaultdict(list)
    prpack: list[tuple[float, float]] = []
    used = []
    for run in chosen:
        took = False
        for r in run["rows"]:
            if is_prpack(r["provider"]):
                prpack.append((float(run["N"]), float(r["ms_per_query"])))
                took = True
            elif is_ours(r["provider"]) and int(r["Q"]) == batch:
                ours[series_name(r)].append((float(run["N"]), float(r["ms_per_query"])))
                took = True
        if took:
            used.append(run)
    ours = {name: pts for name, pts in ours.items() if len(pts) >= 2}  # a line, not a dot
    if not prpack or not ours:
        return f"skipped: no {threads}-thread runs with prpack and Q={batch} rows"
    fig, ax = plt.subplots(figsize=(8, 5.5))
    prpack.sort()
    ax.plot([n for n, _ in prpack], [m for _, m in prpack], "k:o", linewidth=2,
            label="igraph prpack (float64, 1 query at a time)")
    pr_at = dict(prpack)
    for name, pts in sorted(ours.items()):
        pts.sort()
        line = ax.plot([n for n, _ in pts], [m for _, m in pts], marker="o",
                       label=f"{name}, Q={batch}", **style(name))[0]
        for n, m in pts:
            if n in pr_at:
                ax.annotate(f"{pr_at[n] / m:.0f}x", (n, m), textcoords="offset points",
                            xytext=(4, -12), fontsize=8, color=line.get_color())
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("graph nodes N (log)")
    ax.set_ylabel("ms per query (median, log)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    graphs = "; ".join(f"{r.get('graph', '?')} N={int(r['N']):,}" for r in used)
    ax.set_title(f"PPR ms/query vs graph size, {threads} thread(s), our batch Q={batch} "
                 f"(label: speed-up over prpack; providers run at >= 2 sizes)\n"
                 f"{provenance_line(used)}\n{graphs}", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return f"{len(used)} runs"


# ---------------------------------------------------------------------------------------------
# recall


def recall_curve(recall: Any) -> list[tuple[int, float]]:
    """{"1": 33.9, "2": ...} -> [(1, 33.9), ...] sorted; non-numeric entries dropped."""
    if not isinstance(recall, dict):
        return []
    pts = []
    for k, v in recall.items():
        try:
            kk = int(k)
        except (TypeError, ValueError):
            continue
        if number(v) is not None:
            pts.append((kk, float(v)))
    return sorted(pts)


def recall_sources(results: Path, eval_json: Path | None) -> list[dict[str, Any]]:
    """Candidate recall sources: {"label", "curves": {mode: [(k, r)]}, "rows": provenance}."""
    out = []
    if eval_json is not None:
        data = json.loads(eval_json.read_text())
        modes = data.get("modes", {}) if isinstance(data, dict) else {}
        curves = {m: recall_curve(modes.get(m, {}).get("recall")) for m in RECALL_MODES
                  if isinstance(modes.get(m), dict)}
        n = data.get("n_questions")
        out.append({"label": f"hippo-gpu eval --json {eval_json.name}"
                             + (f", {n} questions" if n else ""),
                    "curves": curves, "rows": [data], "time": when(data)})
    for row in read_jsonl(results / "bench_precision.jsonl"):
        parts = row.get("part1")
        if not isinstance(parts, list):
            continue
        curves = {p["mode"]: recall_curve(p.get("recall")) for p in parts
                  if isinstance(p, dict) and p.get("mode") in RECALL_MODES
                  and p.get("precision") == "float32"}
        q = row.get("Q")
        out.append({"label": f"bench_precision.jsonl (float32{f', {q} questions' if q else ''}"
                             f", {Path(str(row.get('data', ''))).name or 'data?'})",
                    "curves": curves, "rows": [row], "time": when(row)})
    for row in read_jsonl(results / "tune_hybrid.jsonl"):
        rec = row.get("recall")
        if not isinstance(rec, dict):
            continue
        curves = {m: recall_curve(rec[m].get("all")) for m in RECALL_MODES
                  if isinstance(rec.get(m), dict)}
        out.append({"label": "tune_hybrid.jsonl (all questions; hybrid tuned on half)",
                    "curves": curves, "rows": [row], "time": when(row)})
    return [s for s in out if all(len(s["curves"].get(m, [])) >= 2 for m in RECALL_MODES)]


def plot_recall(plt: Any, results: Path, eval_json: Path | None, out: Path) -> str:
    sources = recall_sources(results, eval_json)
    if not sources:
        return "skipped: no source with recall@k for dense, hipporag2 and hybrid"
    # the most k values wins (a curve, not 4 points); then an explicit --eval-json; then newest
    best = max(sources, key=lambda s: (min(len(s["curves"][m]) for m in RECALL_MODES),
                                       s is sources[0] and eval_json is not None, s["time"]))
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for m in RECALL_MODES:
        pts = best["curves"][m]
        ax.plot([k for k, _ in pts], [r for _, r in pts], marker="o", label=m,
                color=MODE_COLORS[m])
    ks = sorted({k for m in RECALL_MODES for k, _ in best["curves"][m]})
    ax.set_xscale("log")
    ax.set_xticks(ks)
    ax.set_xticklabels([str(k) for k in ks])
    ax.set_xlabel("k (passages retrieved)")
    ax.set_ylabel("recall@k (%)")
    ax.set_ylim(0, 100)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax.set_title(f"Recall@k, k = {ks[0]}..{ks[-1]}: {best['label']}\n"
                 f"{provenance_line(best['rows'])}", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return best["label"]


def run_eval(data: Path, out_json: Path, threads: int | None) -> None:
    """`hippo-gpu eval --json out_json` on `data`, then this checkout's provenance added to it."""
    cmd = ["hippo-gpu", "eval", "--data", str(data), "--modes", ",".join(RECALL_MODES),
           "--top-k", "200", "--json", str(out_json)]
    if threads:
        cmd += ["--threads", str(threads)]
    print("running:", " ".join(cmd))
    subprocess.run(cmd, check=True)
    data_out = json.loads(out_json.read_text())
    record = provenance("eval", threads=threads, device=str(data_out.get("device", "cpu")),
                        encoder_backend=data_out.get("query_backend"),
                        precision=data_out.get("precision", "float32"),
                        query_precision=data_out.get("query_precision"))
    out_json.write_text(json.dumps({**record, **data_out, "data": str(data)}, indent=2))


# ---------------------------------------------------------------------------------------------
# server


def server_series(rows: list[dict[str, Any]], skipped: dict[str, int]
                  ) -> list[tuple[str, list[dict[str, Any]]]]:
    """Rows grouped into sweeps: same settings, consecutive in the file, clients not repeating.
    A sweep is labelled by what its rows record (batching, query precision, top_k, start time)."""
    series: list[tuple[tuple, list[dict[str, Any]]]] = []
    for row in rows:
        cfg = row.get("config") if isinstance(row.get("config"), dict) else {}
        lat = row.get("latency_ms") if isinstance(row.get("latency_ms"), dict) else {}
        if number(row.get("concurrency")) is None or number(row.get("qps")) is None \
                or number(lat.get("p99")) is None:
            skipped["server rows without concurrency, qps or latency_ms.p99"] += 1
            continue
        key = (row.get("commit"), cfg.get("batching"), cfg.get("mode"), cfg.get("top_k"),
               threads_of(row), row.get("query_precision") or cfg.get("query_precision"),
               cfg.get("requests_per_client"), cfg.get("max_batch"))
        if series and series[-1][0] == key and all(
                r["concurrency"] < row["concurrency"] for r in series[-1][1]):
            series[-1][1].append(row)
        else:
            series.append((key, [row]))
    out = []
    for key, group in series:
        _, batching, mode, top_k, _, qp, per_client, _ = key
        label = (f"batching {batching or '?'}, "
                 + (f"{qp} queries" if qp else "query precision not recorded")
                 + f", {mode} top {top_k}, {per_client} req/client, {when(group[0])[11:16]}")
        out.append((label, group))
    return out


def plot_server(plt: Any, rows: list[dict[str, Any]], out: Path, skipped: dict[str, int]) -> str:
    series = server_series(rows, skipped)
    if not series:
        return "skipped: no server rows with concurrency, qps and p99"
    fig, (ax_q, ax_l) = plt.subplots(1, 2, figsize=(13, 5.5))
    for label, group in series:
        c = [r["concurrency"] for r in group]
        ax_q.plot(c, [r["qps"] for r in group], marker="o", label=label)
        ax_l.plot(c, [r["latency_ms"]["p99"] for r in group], marker="o", label=label)
    for ax, ylabel in ((ax_q, "queries per second"), (ax_l, "p99 latency (ms, log)")):
        plain_log2_axis(ax, [r["concurrency"] for _, g in series for r in g])
        ax.set_xlabel("concurrent clients (1 query per request)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_l.set_yscale("log")
    handles, labels = ax_q.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8)
    all_rows = [r for _, g in series for r in g]
    idx = next((r.get("index") for r in all_rows if isinstance(r.get("index"), dict)), {})
    what = f"index: {idx.get('passage_nodes', '?')} passages" if idx else ""
    fig.suptitle(f"hippo-gpu serve: QPS and p99 latency vs clients ({what})\n"
                 f"{provenance_line(all_rows)}", fontsize=9)
    fig.tight_layout(rect=(0, 0.04 + 0.035 * math.ceil(len(series) / 2), 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return f"{len(series)} sweeps"


# ---------------------------------------------------------------------------------------------


def plot_scale(plt: Any, rows: list[dict[str, Any]], out: Path) -> str:
    """bench_scale.jsonl -> ms/query (hipporag2, dense at each Q) and peak RSS vs passages.

    The latest line per passage count (one machine's run, as bench_scale writes them)."""
    runs = pick_latest([r for r in rows if r.get("bench") == "scale"], key=lambda r: r["passages"])
    runs = sorted(runs, key=lambda r: r["passages"])
    if not runs:
        return "skipped: no bench_scale lines"
    sizes = [r["passages"] for r in runs]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    keys = sorted({k for r in runs for k in r["query"]["ms_per_query"]},
                  key=lambda k: (k.split("@")[0], int(k.split("@")[1])))
    for k in keys:
        mode, q = k.split("@")
        ys = [r["query"]["ms_per_query"].get(k) for r in runs]
        ax1.plot(sizes, ys, marker="o", label=f"{mode} Q={q}",
                 color=MODE_COLORS.get(mode), alpha=0.4 + 0.6 * int(q) / 256)
    prp = [(r["passages"], r.get("prpack", {}).get("prpack_ms_per_query")) for r in runs]
    prp = [(p, v) for p, v in prp if v is not None]
    if prp:
        ax1.plot(*zip(*prp), marker="s", linestyle="--", color="black", label="igraph prpack")
    ax1.set(xscale="log", yscale="log", xlabel="passages", ylabel="ms / query",
            title="retrieval cost vs corpus size")
    ax1.legend(fontsize=7)
    for phase, color in (("build", "tab:red"), ("query", "tab:blue")):
        ax2.plot(sizes, [r[phase]["peak_rss_gb"] for r in runs], marker="o", color=color,
                 label=f"{phase} peak RSS")
    ax2.set(xscale="log", xlabel="passages", ylabel="GB", title="peak RSS vs corpus size")
    ax2.legend(fontsize=7)
    fig.suptitle(provenance_line(runs), fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return f"{len(runs)} sizes"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder of *.jsonl results")
    ap.add_argument("--out", type=Path, default=REPO / "docs", help="folder for the PNGs")
    ap.add_argument("--eval-json", type=Path, default=None,
                    help="`hippo-gpu eval --json` output with recall@1..200 (with --run-eval: "
                         f"where to write it; default: {EVAL_JSON.relative_to(REPO)} if present)")
    ap.add_argument("--run-eval", type=Path, default=None, metavar="DATA",
                    help="run `hippo-gpu eval` on DATA first (needs --eval-json)")
    ap.add_argument("--eval-threads", type=int, default=1, help="threads for --run-eval")
    ap.add_argument("--threads", type=int, default=1,
                    help="thread count of the runs in the graph-size plot")
    ap.add_argument("--graph-batch", type=int, default=8,
                    help="our batch size Q in the graph-size plot")
    args = ap.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if args.run_eval is not None:
        if args.eval_json is None:
            ap.error("--run-eval needs --eval-json FILE (where to write the eval's output)")
        args.eval_json.parent.mkdir(parents=True, exist_ok=True)
        run_eval(args.run_eval, args.eval_json, args.eval_threads)
    elif args.eval_json is None and EVAL_JSON.exists():
        args.eval_json = EVAL_JSON
    args.out.mkdir(parents=True, exist_ok=True)
    skipped: dict[str, int] = defaultdict(int)
    runs = ppr_runs(read_jsonl(args.results / "bench_ppr.jsonl"), skipped)
    report = {
        "ppr_batch.png": plot_ppr_batch(plt, runs, args.out / "ppr_batch.png"),
        "ppr_graph_size.png": plot_ppr_graph_size(plt, runs, args.out / "ppr_graph_size.png",
                                                  batch=args.graph_batch, threads=args.threads),
        "recall.png": plot_recall(plt, args.results, args.eval_json, args.out / "recall.png"),
        "server.png": plot_server(plt, read_jsonl(args.results / "bench_server.jsonl"),
                                  args.out / "server.png", skipped),
        "bench_scale.png": plot_scale(plt, read_jsonl(args.results / "bench_scale.jsonl"),
                                      args.out / "bench_scale.png"),
    }
    for name, what in report.items():
        where = args.out / name
        print(f"{where if not what.startswith('skipped') else name}: {what}")
    for why, n in skipped.items():
        print(f"skipped {n} {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
