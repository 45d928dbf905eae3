"""Load test of `hippo-gpu serve`: latency quantiles and QPS with micro-batching on and off.

Starts the server on loopback over an index directory (a subprocess, so the load generator does
not share its interpreter), drives it with N concurrent async httpx clients, each sending one
query per request, bounded by a request count per client and a time limit per level, and prints
p50/p95/p99 latency, QPS, errors, mean served batch size and top-k agreement with a sequential
reference pass (the same server, one request at a time). Appends one JSON line per run to
benchmarks/results/bench_server.jsonl.

    python -m benchmarks.bench_server --index DIR [--queries questions.json]
        [--concurrency 1 8 32 128] [--requests-per-client 50] [--max-seconds 30]
        [--batching both|on|off] [--max-batch 64] [--max-wait-ms 5] [--mode hipporag2] [--top-k 10]

The issue's acceptance run (32 clients x 1,000 requests, 0 errors):
    python -m benchmarks.bench_server --index DIR --batching on --concurrency 32 \
        --requests-per-client 1000 --max-seconds 3600

Each line carries provenance.py's fields: ``precision`` is the served index's embedding precision
(the server loads float32; `hippo-gpu serve` has no precision option), ``query_precision`` the
server's query encoder precision (--query-precision, else the index's encoder precision), and
``batch_sizes`` names the server's micro-batch (``server_max_batch``) apart from the query
encoder's batch (``encoder_query_batch_size``), ``threads`` is the server's torch threads
(--threads; null: torch's default) and ``torch_threads`` is null (the load generator's own count
says nothing about the server). A dirty git tree needs --allow-dirty.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.common import (
    RESULTS,
    add_arguments,
    append_result_or_exit,
    check_clean_or_exit,
    musique_dir,
    provenance,
    requested_backend,
    subprocess_env,
)

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/serve", "hippo_gpu/cli/serve.py", "hippo_gpu/retrieval", "hippo_gpu/ppr",
            "hippo_gpu/embed", "kernels/src", "hippo_gpu/storage", "hippo_gpu/versions",
            "hippo_gpu/indexing", "hippo_gpu/config.py", "hippo_gpu/device.py",
            "hippo_gpu/tables.py")

DEFAULT_OUT = RESULTS / "bench_server.jsonl"


@dataclass
class LevelResult:
    concurrency: int
    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    checked: int = 0
    agreeing: int = 0
    wall_s: float = 0.0

    def error(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1


def load_queries(path: Path) -> list[str]:
    """A JSON list of strings, or of objects with "question" or "query" (HippoRAG format)."""
    items = json.loads(path.read_text())
    if not isinstance(items, list) or not items:
        raise SystemExit(f"{path}: expected a non-empty JSON list")
    out = []
    for it in items:
        q = it if isinstance(it, str) else (it.get("question") or it.get("query"))
        if not isinstance(q, str) or not q.strip():
            raise SystemExit(f"{path}: item without a question: {str(it)[:80]}")
        out.append(q)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen) -> int:
    """SIGINT (the server drains and exits), SIGKILL after 60 s; its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class ServerProcess:
    """`python -m hippo_gpu.cli.serve` on loopback, with its log in a temp file."""

    def __init__(self, args: argparse.Namespace, max_batch: int, query_backend: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        cmd = [
            sys.executable, "-m", "hippo_gpu.cli", "serve",
            "--index", str(args.index), "--host", "127.0.0.1", "--port", str(self.port),
            "--device", args.device, "--max-batch", str(max_batch),
            "--max-wait-ms", str(args.max_wait_ms), "--max-queue", str(args.max_queue),
            "--log-level", "warning", "--query-backend", query_backend,
        ]  # fmt: skip
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        if args.query_precision is not None:
            cmd += ["--query-precision", args.query_precision]
        env = subprocess_env()
        env.pop("HIPPO_GPU_TOKEN", None)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout_s: float) -> float:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1.0).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise SystemExit(f"server not ready after {timeout_s} s:\n{self.tail()}")

    def stats(self) -> dict[str, Any]:
        return httpx.get(self.url + "/v1/stats", timeout=10.0).json()

    def stop(self) -> int:
        return stop_process(self.proc)

    def tail(self, n: int = 4000) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-n:]


async def drive(
    url: str,
    queries: list[str],
    concurrency: int,
    per_client: int,
    max_seconds: float,
    mode: str,
    top_k: int,
    reference: dict[str, list[str]],
) -> LevelResult:
    """`concurrency` clients, each sending up to `per_client` one-query requests."""
    res = LevelResult(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(120.0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:

        async def worker(w: int, deadline: float) -> None:
            for i in range(per_client):
                if time.perf_counter() > deadline:
                    return
                q = queries[(w * per_client + i) % len(queries)]
                t0 = time.perf_counter()
                try:
                    r = await client.post(
                        "/v1/retrieve", json={"queries": [q], "top_k": top_k, "mode": mode}
                    )
                except httpx.HTTPError as e:
                    res.error(type(e).__name__)
                    continue
                if r.status_code != 200:
                    res.error(str(r.status_code))
                    continue
                res.latencies_s.append(time.perf_counter() - t0)
                keys = [h["key"] for h in r.json()["results"][0]]
                if q in reference:
                    res.checked += 1
                    res.agreeing += keys == reference[q]

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w, t0 + max_seconds) for w in range(concurrency)))
        res.wall_s = time.perf_counter() - t0
    return res


async def reference_pass(
    url: str, queries: list[str], mode: str, top_k: int
) -> dict[str, list[str]]:
    """One request at a time: the ranking each query gets in a batch of one."""
    ref: dict[str, list[str]] = {}
    async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:
        for q in dict.fromkeys(queries):
            r = await client.post(
                "/v1/retrieve", json={"queries": [q], "top_k": top_k, "mode": mode}
            )
            r.raise_for_status()
            ref[q] = [h["key"] for h in r.json()["results"][0]]
    return ref


def index_encoder(index_dir: Path) -> dict[str, Any]:
    """The encoder settings the index was built with (its manifest's config), {} if unreadable."""
    try:
        manifest = json.loads((index_dir / "manifest.json").read_text())
        return dict(manifest["config"]["encoder"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def served_device(device: str) -> str:
    """The device the server resolves `device` to (as hippo_gpu.device does for "auto")."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--index", type=Path, required=True, help="index directory")
    p.add_argument("--queries", type=Path, default=None, help="JSON questions (default: musique)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--requests-per-client", type=int, default=50)
    p.add_argument("--max-seconds", type=float, default=30.0, help="time limit per level")
    p.add_argument("--batching", choices=["both", "on", "off"], default="both")
    p.add_argument("--max-batch", type=int, default=64, help="batch size when batching is on")
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--max-queue", type=int, default=4096)
    p.add_argument("--mode", default="hipporag2")
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None, help="torch threads in the server")
    p.add_argument("--query-precision", default=None, help="server query encoder precision")
    p.add_argument("--query-backends", default="auto",
                   help="comma list of server query encoder backends run one after the other in "
                        "this run (e.g. torch,onnx for a before/after of the ONNX encoder)")
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    add_arguments(p)
    args = p.parse_args()
    git = check_clean_or_exit(args.allow_dirty)

    queries = load_queries(args.queries or musique_dir(need=("questions.json",))
                           / "questions.json")
    batchings = {"both": [("on", args.max_batch), ("off", 1)], "on": [("on", args.max_batch)],
                 "off": [("off", 1)]}[args.batching]  # fmt: skip
    backends = [b.strip() for b in args.query_backends.split(",") if b.strip()]
    settings = [(name, mb, qb) for qb in backends for name, mb in batchings]
    encoder = index_encoder(args.index)
    query_precision = args.query_precision or encoder.get("precision", "float32")
    device = served_device(args.device)
    reference: dict[str, list[str]] = {}
    qps: dict[tuple[str, str, int], float] = {}
    print(f"{len(queries)} queries, mode={args.mode}, top_k={args.top_k}, device={device}, "
          f"server threads={args.threads or 'torch default'}, query_precision={query_precision}")
    header = (
        f"{'batching':>8} {'conc':>5} {'reqs':>6} {'err':>4} {'QPS':>8} {'p50 ms':>8} "
        f"{'p95 ms':>8} {'p99 ms':>8} {'batch':>6} {'agree':>6}"
    )
    for name, max_batch, backend in settings:
        server = ServerProcess(args, max_batch, backend)
        try:
            startup_s = server.wait_ready(args.startup_timeout)
            index_stats = server.stats()["index"]
            if not reference:  # also the warm-up: first calls, caches, allocator
                reference = asyncio.run(reference_pass(server.url, queries, args.mode, args.top_k))
            else:
                asyncio.run(reference_pass(server.url, queries[:8], args.mode, args.top_k))
            print(f"\nserver batching {name} (max_batch={max_batch}), query backend {backend}: "
                  f"ready in {startup_s:.1f} s")
            print(header)
            for c in args.concurrency:
                before = server.stats()["batcher"]
                res = asyncio.run(
                    drive(server.url, queries, c, args.requests_per_client, args.max_seconds,
                          args.mode, args.top_k, reference)
                )  # fmt: skip
                after = server.stats()["batcher"]
                batches = after["batches_served"] - before["batches_served"]
                served = after["queries_served"] - before["queries_served"]
                mean_batch = served / batches if batches else 0.0
                lat_ms = np.asarray(res.latencies_s) * 1e3
                q = np.percentile(lat_ms, [50, 95, 99]) if len(lat_ms) else np.zeros(3)
                ok = len(res.latencies_s)
                rate = ok / res.wall_s if res.wall_s > 0 else 0.0
                agree = res.agreeing / res.checked if res.checked else float("nan")
                qps[(backend, name, c)] = rate
                print(
                    f"{name:>8} {c:>5} {ok + res.errors:>6} {res.errors:>4} {rate:>8.1f} "
                    f"{q[0]:>8.2f} {q[1]:>8.2f} {q[2]:>8.2f} {mean_batch:>6.1f} {agree:>6.3f}"
                )
                if res.errors:
                    print(f"         errors: {res.error_kinds}")
                record = {
                    **provenance(
                        "server", threads=args.threads, device=device,
                        encoder_backend=requested_backend(encoder.get("model", ""), backend),
                        precision=index_stats.get("precision", "float32"),
                        query_precision=query_precision,
                        batch_sizes={"server_max_batch": max_batch,
                                     "encoder_query_batch_size": encoder.get("query_batch_size")},
                        optional_versions=("fastapi", "uvicorn", "httpx", "hippo_gpu"),
                        git=git),
                    # the measured work runs in the server process: its threads are `threads`
                    "torch_threads": None,
                    "index": index_stats,
                    "config": {
                        "batching": name,
                        "max_batch": max_batch,
                        "max_wait_ms": args.max_wait_ms,
                        "max_queue": args.max_queue,
                        "mode": args.mode,
                        "top_k": args.top_k,
                        "device": args.device,
                        "threads": args.threads,
                        "query_precision": args.query_precision,
                        "query_backend": backend,
                        "requests_per_client": args.requests_per_client,
                        "max_seconds": args.max_seconds,
                        "n_distinct_queries": len(queries),
                    },  # fmt: skip
                    "concurrency": c,
                    "requests": ok + res.errors,
                    "errors": res.errors,
                    "error_kinds": res.error_kinds,
                    "wall_s": res.wall_s,
                    "qps": rate,
                    "latency_ms": {"p50": q[0], "p95": q[1], "p99": q[2]},
                    "mean_batch_size": mean_batch,
                    "topk_agreement": None if res.checked == 0 else agree,
                    "server_startup_s": startup_s,
                }
                append_result_or_exit(args.out, record, allow_dirty=args.allow_dirty)
        finally:
            rc = server.stop()
            if rc not in (0, -signal.SIGINT):
                print(f"server exit code {rc}:\n{server.tail()}")
    for backend in backends:
        for name in ("on", "off"):
            if (backend, name, 32) in qps and qps.get((backend, "off", 1), 0) > 0:
                print(f"[{backend}] QPS(c=32, batching {name}) / QPS(c=1, batching off) = "
                      f"{qps[(backend, name, 32)] / qps[(backend, 'off', 1)]:.2f}")
    if len(backends) > 1:
        first = backends[0]
        for (backend, name, c), rate in sorted(qps.items()):
            base = qps.get((first, name, c))
            if backend != first and base:
                print(f"QPS {backend} / {first} (batching {name}, {c} clients) = {rate / base:.2f}")
    print(f"appended to {args.out}")


if __name__ == "__main__":
    main()
