"""The Ray back ends on a cluster of three nodes (a head and two workers on this machine: see
tests/distributed/multinode.py) that loses a worker node, killed with SIGKILL, in the middle of
the work. The three CLI commands run at once on the cluster, each with a part on the node that
dies (tests/distributed/multinode.node_loss_drill); each test checks one command's guarantee:

* `retrieve --ray ADDRESS`: the job finishes; every input id is in the output once, in input
  order, with the local command's keys (hippo_gpu.retrieval.batch.retrieve_file);
* `extract --ray ADDRESS` over two OpenAI-compatible loopback endpoints: the OpenIE JSON equals
  the local command's (every passage once, none lost), the cache holds one result per passage,
  and only the shards that ran on the lost node were asked for again;
* `serve --ray ADDRESS --replicas 2` under three querying clients: requests keep being
  answered, with the offline ranking, while Serve replaces the replica of the lost node and
  after; a request fails only if it was in flight on that replica.

Ray's node health checks keep their defaults (a dead node is declared dead after about 15 s),
as on a real cluster: work sent to the lost node's actors in that window must not be given up.
One node loss for the three keeps the module near 90 s on 2 cores;
benchmarks/bench_node_loss.py runs the same drill at 10k queries.
"""

from __future__ import annotations

import json
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
pytest.importorskip("httpx")
pytest.importorskip("openai")

from hippo_gpu.llm.extract import extract_openie  # noqa: E402
from hippo_gpu.retrieval.batch import retrieve_file  # noqa: E402
from tests.distributed.multinode import (  # noqa: E402
    ACTOR,
    REPLICA,
    SHARD,
    Drill,
    local_cluster,
    node_loss_drill,
    ok_passages,
    query_rows,
)
from tests.helpers import QUERIES  # noqa: E402
from tests.llm.fake_llm_server import FaultServer, backend, corpus  # noqa: E402

pytestmark = pytest.mark.slow  # a multi-node cluster started and a node killed: ~3 min on 2 cores

WORKERS, CPUS = 2, 3  # worker nodes and their CPUs: room on one for everything (2.5 CPUs)
QUERY_ROWS, PART_SIZE = 4000, 40  # retrieve lasts ~25 s: past the first shard
PASSAGES, SHARD_SIZE = 64, 8


def serve_body(client: int) -> dict[str, Any]:
    return {"queries": [QUERIES[client % len(QUERIES)]], "top_k": 3, "mode": "dense"}


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
    from hippo_gpu.retrieval.spec import SearcherSpec

    return SearcherSpec(hash_index, device="cpu", threads=1).open()


@pytest.fixture(scope="module")
def drill(hash_index: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Drill, Path, Any]]:
    """(what happened, the work folder, the two LLM endpoints) of one node-loss drill."""
    work = tmp_path_factory.mktemp("drill")
    (work / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in query_rows(QUERY_ROWS)))
    (work / "corpus.json").write_text(json.dumps(corpus(PASSAGES)))
    # The drill needs all three jobs running at once when it kills the node, with retrieve past
    # 3 parts and extract past its first shard. So the LLM answers fast until that shard is
    # committable (40 requests over both servers: 2 shards of 8 passages, 2 calls each, and
    # some to spare), slowly (1 s) from then until the node is lost, and fast again after.
    # Either order of extract and retrieve used to end one of them first (CI, twice).
    llms = FaultServer(delay=0.05), FaultServer(delay=0.05)
    killed = threading.Event()

    def slow_after_first_shard() -> None:
        while not killed.is_set():
            if sum(s.total for s in llms) >= 40:
                for s in llms:
                    s.delay = 1.0
                return
            time.sleep(0.01)

    def speed_up() -> None:
        killed.set()
        for s in llms:
            s.delay = 0.05
    threading.Thread(target=slow_after_first_shard, daemon=True).start()
    try:
        with local_cluster(WORKERS, CPUS) as cluster:
            done = node_loss_drill(cluster, hash_index, work / "q.jsonl", work / "corpus.json",
                                   [f"openai:fake@{s.url}" for s in llms], work,
                                   body_of=serve_body, part_size=PART_SIZE,
                                   shard_size=SHARD_SIZE, timeout_s=180,
                                   after_kill=speed_up)
        yield done, work, llms
    finally:
        for s in llms:
            s.close()


def test_the_lost_node_ran_a_part_of_each_job(drill):
    d, _, _ = drill
    print(f"drill: {d.marks} (s), actor restarts {d.restarts}")
    assert d.lost[ACTOR] == 1 and d.lost[REPLICA] == 1 and d.lost[SHARD] >= 1
    assert 3 <= d.parts_at_kill < -(-QUERY_ROWS // PART_SIZE)  # mid-job
    assert 1 <= d.passages_at_kill < PASSAGES
    if d.restarts is not None:  # the lost node's retrieve actor was restarted elsewhere
        assert d.restarts.get(ACTOR.removeprefix("ray::"), 0) >= 1, d.restarts


def test_retrieve_survives_a_lost_node(drill, hash_searcher):
    d, work, _ = drill
    assert d.retrieve.rc == 0, d.retrieve.output[-3000:]
    said = " ".join(d.retrieve.output.split())
    assert f"{QUERY_ROWS} rows" in said
    assert f"{QUERY_ROWS} answered, 0 from committed parts, 0 malformed" in said
    got = [json.loads(line) for line in (work / "ray.jsonl").read_text().splitlines()]
    rows = query_rows(QUERY_ROWS)
    assert [g["id"] for g in got] == [r["id"] for r in rows]  # every id exactly once, in order
    local = work / "local.jsonl"
    retrieve_file(hash_searcher, work / "q.jsonl", local, top_k=5, batch_size=32,
                  show_progress=False)
    want = [json.loads(line) for line in local.read_text().splitlines()]
    assert [g["keys"] for g in got] == [w["keys"] for w in want]
    assert [g["titles"] for g in got] == [w["titles"] for w in want]
    for g, w in zip(got, want, strict=True):
        assert g["scores"] == pytest.approx(w["scores"], abs=1e-6)
    assert not (work / "ray.jsonl.parts").exists()


def test_extract_survives_a_lost_node(drill, tmp_path):
    d, work, llms = drill
    assert d.extract.rc == 0, d.extract.output[-3000:]
    local = FaultServer()
    try:
        extract_openie(corpus(PASSAGES), backend(local.url), tmp_path / "local.json",
                       show_progress=False)
    finally:
        local.close()
    got = json.loads((work / "openie.json").read_text())
    assert got == json.loads((tmp_path / "local.json").read_text())  # every passage, once
    assert ok_passages(work / "openie.json.cache.sqlite") == PASSAGES  # one result each
    # Asked again: at most the passages of the shards that were running on the lost node.
    asked = Counter(t for s in llms for (t, stage), k in s.requests.items()
                    if stage == "triples" for _ in range(k))
    assert set(asked) == {p["title"] for p in corpus(PASSAGES)}
    assert sum(k - 1 for k in asked.values()) <= d.lost[SHARD] * SHARD_SIZE


def test_serve_answers_through_a_lost_replica_node(drill, hash_searcher):
    from tests.serve.helpers import offline_hits

    d, _, _ = drill
    assert d.replaced_at is not None, "Serve did not replace the lost replica in 180 s"
    load = d.load
    failed = load.failed()
    gap = load.sent(d.killed_at, d.replaced_at)
    print(f"serve: {len(load.log)} requests, {len(gap)} in the {d.replaced_at - d.killed_at:.1f}"
          f" s gap, {len(failed)} failed: {Counter(r[3] for r in failed)}")
    assert len(d.replicas_after) == 2 and len(d.replicas_after - d.replicas_before) == 1
    # Only requests in flight on the lost replica may fail (a client has one at a time), so
    # none answered before the kill, none sent after the replacement, at most one per client.
    assert all(answered >= d.killed_at for _, answered, *_ in failed), failed
    assert not load.failed(since=d.replaced_at)
    assert len(failed) <= load.clients
    assert len(gap) - len(failed) >= 10  # the other replica answered during the gap
    assert len(load.sent(since=d.replaced_at)) >= load.clients
    want = [offline_hits(hash_searcher, serve_body(c)["queries"], 3, "dense")
            for c in range(load.clients)]
    for _, _, client, status, body in load.log:
        if status == 200:
            assert [[h["key"] for h in hits] for hits in body["results"]] == \
                [[h["key"] for h in hits] for hits in want[client]]
