"""A Ray cluster of several nodes on this one machine, and what losing one of them takes: for
tests/distributed/test_ray_multinode.py and benchmarks/bench_node_loss.py.

`local_cluster` starts Ray's own multi-node test cluster (ray.cluster_utils.Cluster): a head
node with no CPUs (it holds the GCS, the driver's objects and, for Serve, the controller and the
HTTP proxy; no work is scheduled there, so losing a worker never loses them) and `workers`
worker nodes, each a raylet with its own object store, as a real cluster's machines are. The
driver (this process) joins it with `ray.init(address)`. Ray's node health checks keep their
defaults unless `system_config` says otherwise, so a killed node is declared dead as late as on
a real cluster (about 15 s: 5 missed checks 3 s apart).

`node_running` picks a worker node by what it runs (the title of a Ray worker process:
"ray::MapWorker(MapBatches(IndexActor))", "ray::_run_shard", "ray::ServeReplica:...") and
`kill_node` kills its raylet, object store and agents with SIGKILL, without a graceful
shutdown: what a machine that loses power does to its Ray processes. The worker processes of
the node then die with it.

`node_loss_drill` runs the three Ray commands of the CLI at once against one cluster and kills
a worker node that runs a part of each: one node loss (and one wait for the cluster to declare
the node dead) for the three guarantees.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from tests.helpers import QUERIES, REPO

STORE = 80 << 20  # bytes of object store per node (Ray's minimum is 75 MiB)


@contextmanager
def local_cluster(workers: int = 2, cpus_per_node: float = 1,
                  system_config: dict[str, Any] | None = None) -> Iterator[Any]:
    """A started ray.cluster_utils.Cluster (head without CPUs + `workers` nodes), this process
    joined to it; shut down after the block."""
    from ray.cluster_utils import Cluster

    head: dict[str, Any] = {"num_cpus": 0, "object_store_memory": STORE,
                            "include_dashboard": False}
    if system_config:
        head["_system_config"] = system_config
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        add_workers(cluster, workers, cpus_per_node)
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def add_workers(cluster: Any, until: int, cpus_per_node: float = 1) -> None:
    """Add worker nodes until the cluster has `until` of them, and wait until they are up."""
    while len(cluster.worker_nodes) < until:
        cluster.add_node(num_cpus=cpus_per_node, object_store_memory=STORE)
    cluster.wait_for_nodes()


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = defaultdict(list)
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            kids[int(stat.rsplit(")", 1)[1].split()[1])].append(int(d.name))
    return kids


def processes_on(node: Any) -> list[str]:
    """The command lines (Ray sets them to the worker's title) of every process under the
    node's raylet."""
    kids, todo, titles = _children(), [node.all_processes["raylet"][0].process.pid], []
    while todo:
        for pid in kids.get(todo.pop(), []):
            todo.append(pid)
            try:
                raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            titles.append(raw.replace(b"\0", b" ").decode(errors="replace").strip())
    return titles


def node_running(cluster: Any, *titles: str) -> Any:
    """The first worker node (by node id) with, for each of `titles`, a process whose title
    holds it; None when no node runs them all."""
    for node in sorted(cluster.worker_nodes, key=lambda n: n.node_id):
        running = processes_on(node)
        if all(any(title in t for t in running) for title in titles):
            return node
    return None


def kill_node(cluster: Any, node: Any) -> None:
    """SIGKILL the node's raylet, object store and agents, with no graceful shutdown."""
    cluster.remove_node(node, allow_graceful=False)


@dataclass
class Load:
    """`clients` threads that POST `body_of(client)` to `url + path` one after another until
    stopped; every request is recorded as (sent at, answered at, client, HTTP status or the
    transport error's class name, JSON body or None)."""

    url: str
    clients: int
    body_of: Any
    path: str = "/v1/retrieve"
    timeout_s: float = 30.0
    log: list[tuple[float, float, int, int | str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True)
                         for i in range(self.clients)]

    def _client(self, i: int) -> None:
        import httpx

        with httpx.Client(base_url=self.url, timeout=self.timeout_s) as client:
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    r = client.post(self.path, json=self.body_of(i))
                    status: int | str = r.status_code
                    body = r.json() if r.status_code == 200 else None
                except Exception as e:  # a refused or dropped connection, a timeout
                    status, body = type(e).__name__, None
                self.log.append((t0, time.monotonic(), i, status, body))

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout_s + 5)

    def failed(self, since: float = float("-inf"), until: float = float("inf")) -> list[Any]:
        """The requests sent in [since, until) that got no 200."""
        return [r for r in self.log if since <= r[0] < until and r[3] != 200]

    def sent(self, since: float = float("-inf"), until: float = float("inf")) -> list[Any]:
        return [r for r in self.log if since <= r[0] < until]


def serve_replicas() -> set[str]:
    """Names of the live hippo-gpu Ray Serve replica actors (a replacement gets a new name)."""
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == "serve" and "HippoReplica" in a["name"]}


def wait_for(what: str, check: Any, timeout_s: float, every_s: float = 0.2) -> float:
    """Poll `check()` until it is true; returns the seconds waited (AssertionError on time)."""
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < timeout_s, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(every_s)
    return time.monotonic() - t0


# --- the drill: the three Ray commands at once, one worker node lost under them ---------------

ACTOR = "ray::MapWorker(MapBatches(IndexActor))"  # a `retrieve --ray` replica
SHARD = "ray::_run_shard"  # an `extract --ray` shard task
REPLICA = "ray::ServeReplica:hippo-gpu:HippoReplica"  # a `serve --ray` replica


class Job:
    """A CLI subprocess, its output (stdout and stderr) going to `log`, a file (a pipe nobody
    reads while the drill waits would fill and stall the command); a thread notes when it
    ends."""

    def __init__(self, args: list[str], log: Path) -> None:
        env = {**os.environ,
               "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "hippo_gpu.cli", *args],
                                         env=env, stdout=out, stderr=subprocess.STDOUT)
        self.started, self.ended = time.monotonic(), float("nan")
        self.rc: int | None = None
        self.output = ""
        self._waiter = threading.Thread(target=self._wait, daemon=True)
        self._waiter.start()

    def _wait(self) -> None:
        self.proc.wait()
        self.ended = time.monotonic()

    @property
    def seconds(self) -> float:
        """From the start to the end of the command (nan while it runs)."""
        return self.ended - self.started

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def finish(self, timeout_s: float) -> None:
        """Wait for the end (kill it after `timeout_s`); read its exit status and output."""
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._waiter.join(10)
        self.rc, self.output = self.proc.returncode, self.tail(1 << 20)


@dataclass
class Drill:
    """What happened: the jobs, the serve load, when the node died and what it ran then."""

    retrieve: Job
    extract: Job
    load: Load
    killed_at: float  # time.monotonic() when the kill began
    replaced_at: float | None  # ... when Serve ran a new replica in the lost one's place
    parts_at_kill: int  # retrieve's committed parts when the node died
    passages_at_kill: int  # extract's passages in the driver's cache when the node died
    lost: dict[str, int]  # processes of each kind on the lost node
    replicas_before: set[str]
    replicas_after: set[str]
    marks: dict[str, float]  # seconds from the drill's start: deployed, killed, replaced, ...
    restarts: dict[str, int] | None  # actor restarts by class (None: not readable)


def query_rows(n: int) -> list[dict[str, Any]]:
    """`n` query rows {"id", "query"} about the sample corpus, ids int and str mixed."""
    words = ["lighthouse", "Alzheimer", "tidal clock", "museum", "river", "college", "Skerrow"]
    return [{"id": i if i % 3 else f"q{i}",
             "query": f"{QUERIES[i % len(QUERIES)]} {words[i % len(words)]} {i % 101}"}
            for i in range(n)]


def actor_restarts() -> dict[str, int] | None:
    """Restarts per actor class, dead actors included, from the GCS's actor table (Ray's
    state API needs the dashboard, which this cluster does not run; the table's reader is
    private to Ray, so None if it is not there)."""
    try:
        from ray._private.state import actors

        table = actors()
    except (ImportError, AttributeError):
        return None
    restarts: Counter[str] = Counter()
    for a in table.values():
        restarts[a.get("ActorClassName", "?")] += int(a.get("NumRestarts", 0))
    return dict(restarts)


def ok_passages(cache: Path) -> int:
    """Passages whose OpenIE the driver has committed to its cache."""
    import sqlite3

    if not cache.exists():
        return 0
    db = sqlite3.connect(cache, timeout=5)
    try:
        return int(db.execute("SELECT COUNT(*) FROM results WHERE task = 'openie' AND "
                              "status = 'ok'").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


def node_loss_drill(cluster: Any, index: Path, queries: Path, corpus: Path,
                    endpoints: list[str], work: Path, *, body_of: Any, clients: int = 3,
                    part_size: int = 40, shard_size: int = 8, replicas: int = 2,
                    threads: int = 1, timeout_s: float = 300, after_kill: Any = None) -> Drill:
    """Serve `index` with `serve --ray ADDRESS --replicas N` under `clients` querying clients;
    run `retrieve --ray ADDRESS` over `queries` (2 workers) and `extract --ray ADDRESS` over
    `corpus` (`endpoints`, 2 shards in flight) into `work`; once retrieve has committed 3
    parts and extract a shard, kill the first worker node that runs a retrieve replica, a
    shard and a Serve replica at that moment; wait until Serve runs its `replicas` again, one
    of them new (`timeout_s` at most: then Drill.replaced_at is None), and both jobs end.
    Every command gets `threads` torch threads. `after_kill()`, if given, runs once the node
    is gone: a caller whose LLM endpoints answer slowly, so that extract cannot end before the
    kill however fast retrieve starts, speeds them up there.

    Serve's HTTP proxy runs on the head node only (all the nodes here share one address, so a
    proxy per node could not each bind the port; a real cluster puts one on every node),
    started here first; the CLI joins that Serve instance."""
    from ray import serve

    address, t0 = cluster.address, time.monotonic()
    marks: dict[str, float] = {}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    server = Job(["serve", "--index", str(index), "--ray", address, "--replicas",
                  str(replicas), "--cpus-per-replica", "0.5", "--threads", str(threads),
                  "--port", str(port), "--device", "cpu"], work / "serve.log")
    retrieve = extract = None
    try:
        def deployed() -> bool:
            assert server.proc.poll() is None, server.tail()
            app = serve.status().applications.get("hippo-gpu")
            return app is not None and app.status == "RUNNING"

        wait_for("the serve --ray deployment", deployed, timeout_s, every_s=0.5)
        marks["deployed"] = time.monotonic() - t0
        before = serve_replicas()
        out, cache = work / "ray.jsonl", work / "openie.json.cache.sqlite"
        parts = work / "ray.jsonl.parts"
        with Load(f"http://127.0.0.1:{port}", clients, body_of) as load:
            retrieve = Job(["retrieve", "--index", str(index), "--queries", str(queries),
                            "--out", str(out), "--top-k", "5", "--batch-size", "32",
                            "--part-size", str(part_size), "--device", "cpu", "--threads",
                            str(threads), "--ray", address, "--workers", "2",
                            "--cpus-per-worker", "0.5"], work / "retrieve.log")
            extract = Job(["extract", "--corpus", str(corpus), "--out",
                           str(work / "openie.json"), "--cache", str(cache), "--llm",
                           ",".join(endpoints), "--ray", address, "--shard-size",
                           str(shard_size), "--wave-size", "4", "--workers", "2",
                           "--concurrency", "2"], work / "extract.log")
            victim: list[Any] = []

            def all_three_busy() -> bool:
                for job in (retrieve, extract):
                    assert job.proc.poll() is None, "a job ended before the node was lost:\n" \
                        + job.tail()
                if len(list(parts.glob("part-*.parquet"))) < 3 or ok_passages(cache) < 1:
                    return False
                node = node_running(cluster, ACTOR, SHARD, REPLICA)
                if node is not None:
                    victim.append(node)
                return node is not None

            wait_for("a node running all three", all_three_busy, timeout_s, every_s=0.02)
            running = processes_on(victim[0])
            lost = {k: sum(k in t for t in running) for k in (ACTOR, SHARD, REPLICA)}
            parts_at_kill = len(list(parts.glob("part-*.parquet")))
            passages_at_kill = ok_passages(cache)
            killed_at = time.monotonic()
            kill_node(cluster, victim[0])
            marks["killed"] = killed_at - t0
            if after_kill is not None:
                after_kill()

            def replaced() -> bool:
                states = serve.status().applications["hippo-gpu"].deployments[
                    "HippoReplica"].replica_states
                return states == {"RUNNING": replicas} and len(serve_replicas() - before) == 1

            replaced_at: float | None = None  # Serve never replaced it: the caller says so
            try:
                wait_for("a replacement Serve replica", replaced, timeout_s, every_s=0.5)
                replaced_at = time.monotonic()
                marks["replaced"] = replaced_at - t0
            except AssertionError:
                pass
            for name, job in (("retrieve", retrieve), ("extract", extract)):
                job.finish(timeout_s)
                marks[f"{name} done"] = job.ended - t0
            time.sleep(1.0)  # traffic after the replacement
        return Drill(retrieve, extract, load, killed_at, replaced_at, parts_at_kill,
                     passages_at_kill, lost, before, serve_replicas(), marks, actor_restarts())
    finally:
        for job in (retrieve, extract):
            if job is not None and job.proc.poll() is None:
                job.proc.kill()
        server.proc.send_signal(signal.SIGINT)
        server.finish(60)
        serve.shutdown()
