"""The Ray back ends on a cluster of three nodes (a head and two workers, on this machine: see
tests/distributed/multinode.py) that loses a worker node, killed with SIGKILL, in the middle of
the work:

* `retrieve --ray ADDRESS`: the job finishes; every input id is in the output once, in input
  order, with the local command's keys (hippo_gpu.batch.retrieve_file);
* `extract --ray ADDRESS` over two OpenAI-compatible loopback endpoints: the OpenIE JSON equals
  the local command's (every passage once, none lost), the cache holds one result per passage,
  and only the shards that ran on the lost node were asked for again;
* `serve --ray ADDRESS --replicas 2`: requests keep being answered, with the offline ranking,
  while Serve replaces the replica of the lost node and after; a request fails only if it was
  in flight on that replica.

Ray's node health checks keep their defaults (a dead node is declared dead after about 15 s),
as on a real cluster: work sent to the lost node's actors in that window must not be given up.
After each test a fresh worker node replaces the lost one. Sized for about 90 s on 2 cores;
benchmarks/bench_node_loss.py runs the same jobs at 10k queries.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")
pytest.importorskip("ray.serve")
pytest.importorskip("pyarrow")
httpx = pytest.importorskip("httpx")

from hippo_gpu.batch import retrieve_file  # noqa: E402
from tests.distributed.multinode import (  # noqa: E402
    Load,
    add_workers,
    kill_node_running,
    local_cluster,
    serve_replicas,
    wait_for,
)
from tests.helpers import QUERIES, REPO  # noqa: E402

WORKERS = 2  # worker nodes, 1 CPU each; the head has none
ACTOR = "ray::MapWorker(MapBatches(IndexActor))"
SHARD = "ray::_run_shard"
REPLICA = "ray::ServeReplica:hippo-gpu:HippoReplica"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_cluster(WORKERS) as c:
        yield c


@pytest.fixture
def nodes(cluster: Any) -> Iterator[Any]:
    """The cluster, given back with WORKERS live worker nodes (a lost one replaced)."""
    add_workers(cluster, WORKERS)
    yield cluster
    add_workers(cluster, WORKERS)


@pytest.fixture(scope="module")
def hash_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled sample corpus indexed with the weightless hash encoder: an actor or replica
    opens it in about a second (no model to load)."""
    from hippo_gpu import build_index
    from hippo_gpu.sample import paths

    out = tmp_path_factory.mktemp("multinode") / "index"
    files = paths()
    build_index(files["corpus"], files["openie"], out, device="cpu", encoder="hash:64")
    return out


@pytest.fixture(scope="module")
def hash_searcher(hash_index: Path) -> Any:
    from hippo_gpu.searcher_spec import SearcherSpec

    return SearcherSpec(hash_index, device="cpu", threads=1).open()


def test_the_cluster_has_its_nodes(cluster):
    """The fixture's premise: three live nodes, the head without CPUs, each worker with one and
    its own raylet and object store."""
    alive = [n for n in ray.nodes() if n["Alive"]]
    assert len(alive) == 1 + WORKERS
    assert sorted(n["Resources"].get("CPU", 0) for n in alive) == [0] + [1] * WORKERS


def _kill_when(cluster: Any, ready: Any, title: str, seen: dict[str, Any]) -> threading.Thread:
    """A thread that waits for `ready()`, then kills a worker node running `title` processes;
    it records in `seen`: "at" (time.monotonic), "running" (such processes on that node),
    "state" (what `ready()` returned), or "error"."""
    def run() -> None:
        try:
            deadline = time.monotonic() + 120
            while not (state := ready()):
                assert time.monotonic() < deadline, "the job never got far enough to kill"
                time.sleep(0.02)
            seen["state"] = state
            seen["running"] = kill_node_running(cluster, title)
            seen["at"] = time.monotonic()
        except BaseException as e:  # reported by the test
            seen["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _query_rows(n: int) -> list[dict[str, Any]]:
    words = ["lighthouse", "Alzheimer", "tidal clock", "museum", "river", "college", "Skerrow"]
    return [{"id": i if i % 3 else f"q{i}",
             "query": f"{QUERIES[i % len(QUERIES)]} {words[i % len(words)]} {i % 101}"}
            for i in range(n)]


def test_retrieve_survives_a_lost_node(nodes, hash_index, hash_searcher, tmp_path):
    from typer.testing import CliRunner

    from hippo_gpu.cli import app

    n, part_size = 1200, 40
    rows = _query_rows(n)
    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out, parts = tmp_path / "ray.jsonl", tmp_path / "ray.jsonl.parts"
    seen: dict[str, Any] = {}

    def three_parts() -> int:  # some chunks committed, most still to do
        done = len(list(parts.glob("part-*.parquet")))
        return done if done >= 3 else 0

    killer = _kill_when(nodes, three_parts, ACTOR, seen)
    res = CliRunner().invoke(app, [
        "retrieve", "--index", str(hash_index), "--queries", str(q), "--out", str(out),
        "--top-k", "5", "--batch-size", "32", "--part-size", str(part_size), "--device", "cpu",
        "--threads", "1", "--ray", nodes.address, "--workers", "2", "--cpus-per-worker", "0.5"])
    killer.join(5)
    assert "error" not in seen, seen.get("error")
    assert res.exit_code == 0, res.output[-3000:]
    assert seen["running"] >= 1  # the lost node held a replica, busy with a chunk
    assert seen["state"] < n // part_size  # killed mid-job
    said = " ".join(res.output.split())
    assert f"{n} rows" in said and f"{n} answered, 0 from committed parts, 0 malformed" in said

    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["id"] for g in got] == [r["id"] for r in rows]  # every id exactly once, in order
    local = tmp_path / "local.jsonl"
    retrieve_file(hash_searcher, q, local, top_k=5, batch_size=32, show_progress=False)
    want = [json.loads(line) for line in local.read_text().splitlines()]
    assert [g["keys"] for g in got] == [w["keys"] for w in want]
    assert [g["titles"] for g in got] == [w["titles"] for w in want]
    for g, w in zip(got, want, strict=True):
        assert g["scores"] == pytest.approx(w["scores"], abs=1e-6)
    assert not parts.exists()


def test_extract_survives_a_lost_node(nodes, tmp_path):
    pytest.importorskip("openai")
    from typer.testing import CliRunner

    from hippo_gpu.cli import app
    from hippo_gpu.llm.extract import extract_openie
    from tests.llm.test_faults import FaultServer, backend, corpus

    n, shard = 96, 6
    docs = corpus(n)
    (tmp_path / "corpus.json").write_text(json.dumps(docs))
    out, cache = tmp_path / "ray.json", tmp_path / "c.sqlite"
    seen: dict[str, Any] = {}

    def some_committed() -> int:  # shards committed by the driver, others running
        return _ok_passages(cache) if _ok_passages(cache) >= n // 4 else 0

    a, b = FaultServer(delay=0.05), FaultServer(delay=0.05)
    try:
        killer = _kill_when(nodes, some_committed, SHARD, seen)
        res = CliRunner().invoke(app, [
            "extract", "--corpus", str(tmp_path / "corpus.json"), "--out", str(out), "--cache",
            str(cache), "--llm", f"openai:fake@{a.url},openai:fake@{b.url}", "--ray",
            nodes.address, "--shard-size", str(shard), "--wave-size", "3", "--workers", "4",
            "--concurrency", "2"])
        killer.join(5)
    finally:
        a.close(), b.close()
    assert "error" not in seen, seen.get("error")
    assert res.exit_code == 0, res.output[-3000:]
    assert seen["running"] >= 1 and seen["state"] < n  # a shard was running on the lost node

    local = FaultServer()
    try:
        extract_openie(docs, backend(local.url), tmp_path / "local.json", show_progress=False)
    finally:
        local.close()
    got = json.loads(out.read_text())
    assert got == json.loads((tmp_path / "local.json").read_text())  # every passage, once
    assert sorted(d["idx"] for d in got["docs"]) == sorted({d["idx"] for d in got["docs"]})
    assert _ok_passages(cache) == n  # one result per passage in the driver's cache
    # Asked again: at most the passages of the shards that were running on the lost node.
    asked = Counter(t for s in (a, b) for (t, stage), k in s.requests.items()
                    if stage == "triples" for _ in range(k))
    assert set(asked) == {d["title"] for d in docs}
    assert sum(k - 1 for k in asked.values()) <= seen["running"] * shard


def _ok_passages(cache: Path) -> int:
    import sqlite3

    if not cache.exists():
        return 0
    db = sqlite3.connect(cache, timeout=5)
    try:
        return db.execute("SELECT COUNT(*) FROM results WHERE task = 'openie' AND "
                          "status = 'ok'").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


def test_serve_answers_through_a_lost_replica_node(nodes, hash_index, hash_searcher):
    """Three clients query `serve --ray` (two replicas, one per worker node) while a replica's
    node is killed: the other replica answers meanwhile, Serve starts a replacement, and every
    answer is the offline ranking. Serve runs its HTTP proxy on the head only (all the nodes
    here share one address, so a proxy per node could not each bind the port; a real cluster
    puts one on every node), started here first; the CLI joins it."""
    from ray import serve

    from tests.serve.helpers import offline_hits

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hippo_gpu.cli", "serve", "--index", str(hash_index), "--ray",
         nodes.address, "--replicas", "2", "--cpus-per-replica", "0.5", "--threads", "1",
         "--port", str(port), "--device", "cpu"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    queries = [[q] for q in QUERIES]
    want = [offline_hits(hash_searcher, qs, 3, "dense") for qs in queries]
    try:
        def deployed() -> bool:
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:] if proc.stdout \
                else ""
            app = serve.status().applications.get("hippo-gpu")
            return app is not None and app.status == "RUNNING"

        wait_for("the deployment", deployed, 240, every_s=0.5)
        before = serve_replicas()
        assert len(before) == 2
        with Load(url, len(queries), lambda i: {"queries": queries[i], "top_k": 3,
                                                 "mode": "dense"}) as load:
            time.sleep(1.5)
            killed_at = time.monotonic()
            assert kill_node_running(nodes, REPLICA) == 1

            def replaced() -> bool:
                states = serve.status().applications["hippo-gpu"].deployments[
                    "HippoReplica"].replica_states
                return states == {"RUNNING": 2} and len(serve_replicas() - before) == 1

            wait_for("a replacement replica", replaced, 180, every_s=0.5)
            back_at = time.monotonic()
            time.sleep(1.5)
        gap = load.sent(killed_at, back_at)
        print(f"serve: {len(load.log)} requests, {len(gap)} in the {back_at - killed_at:.1f} s "
              f"gap, {len(load.failed())} failed: {Counter(r[3] for r in load.failed())}")
        assert not load.failed(until=killed_at) and not load.failed(since=back_at)
        # Only requests in flight on the lost replica may fail (each client has one at a time).
        assert len(load.failed()) <= len(queries)
        assert len(gap) - len(load.failed()) >= 10  # the other replica answered in the gap
        assert len(load.sent(since=back_at)) >= len(queries)
        for _, _, client, status, body in load.log:
            if status == 200:
                assert [[h["key"] for h in hits] for hits in body["results"]] == \
                    [[h["key"] for h in hits] for hits in want[client]]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        serve.shutdown()
