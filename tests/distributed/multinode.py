"""A Ray cluster of several nodes on this one machine, and what losing one of them takes: for
tests/distributed/test_ray_multinode.py and benchmarks/bench_node_loss.py.

`local_cluster` starts Ray's own multi-node test cluster (ray.cluster_utils.Cluster): a head
node with no CPUs (it holds the GCS, the driver's objects and, for Serve, the controller and the
HTTP proxy; no work is scheduled there, so losing a worker never loses them) and `workers`
worker nodes, each a raylet with its own object store, as a real cluster's machines are. The
driver (this process) joins it with `ray.init(address)`. Ray's node health checks keep their
defaults unless `system_config` says otherwise, so a killed node is declared dead as late as on
a real cluster (about 15 s: 5 missed checks 3 s apart).

`kill_node_running` picks a worker node by what it runs (the title of a Ray worker process:
"ray::MapWorker(MapBatches(IndexActor))", "ray::_run_shard", "ray::ServeReplica:...") and kills
its raylet, object store and agents with SIGKILL, without a graceful shutdown: what a machine
that loses power does to its Ray processes. The worker processes of the node then die with it.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

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


def kill_node_running(cluster: Any, title: str) -> int:
    """SIGKILL the first worker node (by node id) with a process whose title holds `title`;
    returns how many such processes it had. AssertionError when no node runs one."""
    for node in sorted(cluster.worker_nodes, key=lambda n: n.node_id):
        running = sum(title in t for t in processes_on(node))
        if running:
            cluster.remove_node(node, allow_graceful=False)
            return running
    raise AssertionError(f"no worker node runs a {title!r} process")


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
