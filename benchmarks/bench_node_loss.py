"""A Ray cluster that loses a worker node while `retrieve --ray`, `extract --ray` and `serve --ray`
run on it: what each job kept, what it cost.

The drill of tests/distributed/test_ray_multinode.py at full size (the same code:
tests/distributed/multinode.node_loss_drill, so run this from a checkout): a head node and two
worker nodes of Ray's own multi-node cluster (ray.cluster_utils.Cluster) on this machine, Ray's
node health checks at their defaults; the bundled sample corpus indexed with --encoder;
`serve --ray ADDRESS --replicas R` under --clients clients querying back to back; `retrieve --ray
ADDRESS` over --rows queries (2 workers) and `extract --ray ADDRESS` over --passages passages
(two OpenAI-compatible loopback endpoints answering in --llm-delay s, 2 shards in flight); once
both jobs are under way, a worker node that runs a part of all three is killed (SIGKILL of its
raylet, object store and agents). Prints and appends to benchmarks/results/bench_node_loss.jsonl:

* retrieve: ids in, ids out, duplicates, lost, rows whose keys differ from the local command's
  (hippo_gpu.retrieval.batch.retrieve_file), wall time, actor restarts;
* extract: passages, documents out, duplicates, lost, passages asked of the LLM again (their
  triples; their NER apart), wall;
* serve: requests, the gap (node killed -> replacement replica running) in seconds, requests
  sent in the gap, failed requests (in the gap and in all), latency p50/p99 outside and inside
  the gap.

All the nodes share this machine's CPUs (and, on the project's machine, other jobs): wall times
and the gap include that contention; loadavg is in the line.

    python -m benchmarks.bench_node_loss --threads 1 [--rows 10000] [--passages 400]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS,
    add_arguments,
    append_result_or_exit,
    check_clean_or_exit,
    init_threads,
    provenance,
    quantile,
    requested_backend,
    skip,
)

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/distributed", "hippo_gpu/serve", "hippo_gpu/cli", "hippo_gpu/retrieval",
            "hippo_gpu/llm", "hippo_gpu/storage", "hippo_gpu/versions")


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of every actor")
    ap.add_argument("--rows", type=int, default=10_000, help="queries of the retrieve job")
    ap.add_argument("--part-size", type=int, default=200, help="rows per retrieve chunk")
    ap.add_argument("--passages", type=int, default=400, help="passages of the extract job")
    ap.add_argument("--shard-size", type=int, default=8)
    ap.add_argument("--llm-delay", type=float, default=0.1, help="seconds per LLM reply")
    ap.add_argument("--replicas", type=int, default=2, help="serve --ray replicas")
    ap.add_argument("--clients", type=int, default=4, help="serve clients, back to back")
    ap.add_argument("--encoder", default="hash:64",
                    help="the sample index's encoder (hash:64: no model to load per actor)")
    ap.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--results", default=None)
    add_arguments(ap)
    return ap.parse_args()


def _ms(xs: list[float]) -> dict[str, Any]:
    return {"p50_ms": round(quantile(xs, 0.5) * 1e3, 1) if xs else None,
            "p99_ms": round(quantile(xs, 0.99) * 1e3, 1) if xs else None, "n": len(xs)}


def main(args: argparse.Namespace) -> None:
    init_threads(args.threads)
    try:
        import ray  # noqa: F401
        import ray.data  # noqa: F401
        from ray import serve  # noqa: F401

        from tests.distributed.multinode import (
            ACTOR,
            REPLICA,
            SHARD,
            local_cluster,
            node_loss_drill,
            query_rows,
        )
        from tests.llm.fake_llm_server import FaultServer, corpus
    except ImportError as e:
        skip(f"needs Ray (data, serve) and the tests folder of a checkout: {e}")
    from hippo_gpu import build_index
    from hippo_gpu.retrieval.batch import retrieve_file
    from hippo_gpu.retrieval.spec import SearcherSpec
    from hippo_gpu.sample import paths
    from tests.helpers import QUERIES

    git = check_clean_or_exit(args.allow_dirty)
    loadavg_start = [round(x, 2) for x in os.getloadavg()]  # the line's loadavg: at the end
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench_node_loss_"))
    files = paths()
    index = work / "index"
    if not index.exists():
        build_index(files["corpus"], files["openie"], index, device="cpu", encoder=args.encoder)
    rows = query_rows(args.rows)
    (work / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    docs = corpus(args.passages)
    (work / "corpus.json").write_text(json.dumps(docs))

    def body_of(client: int) -> dict[str, Any]:
        return {"queries": [QUERIES[client % len(QUERIES)]], "top_k": 5, "mode": "hipporag2"}

    llms = FaultServer(delay=args.llm_delay), FaultServer(delay=args.llm_delay)
    try:
        with local_cluster(2, 3) as cluster:
            d = node_loss_drill(cluster, index, work / "q.jsonl", work / "corpus.json",
                                [f"openai:fake@{s.url}" for s in llms], work, body_of=body_of,
                                clients=args.clients, part_size=args.part_size,
                                shard_size=args.shard_size, replicas=args.replicas,
                                threads=args.threads)
    finally:
        for s in llms:
            s.close()

    # retrieve: ids, duplicates, lost, keys against the local command
    out = work / "ray.jsonl"
    got = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    want_ids = [r["id"] for r in rows]
    seen = Counter(json.dumps(g["id"]) for g in got)
    local = work / "local.jsonl"
    retrieve_file(SearcherSpec(index, device="cpu", threads=args.threads).open(),
                  work / "q.jsonl", local, top_k=5, batch_size=32, show_progress=False)
    want = {json.dumps(r["id"]): r["keys"] for r in map(json.loads, local.open())}
    retrieve = {
        "rc": d.retrieve.rc, "ids_in": len(want_ids), "ids_out": len(got),
        "duplicates": sum(k - 1 for k in seen.values()),
        "lost": sum(1 for i in want_ids if json.dumps(i) not in seen),
        "in_input_order": [g["id"] for g in got] == want_ids,
        "keys_differ": sum(1 for g in got if want.get(json.dumps(g["id"])) != g["keys"]),
        "wall_s": round(d.retrieve.seconds, 1),
        "parts_at_kill": d.parts_at_kill, "parts": -(-len(rows) // args.part_size),
        "actor_restarts": (d.restarts or {}).get("MapWorker(MapBatches(IndexActor))"),
    }

    # extract: documents out, duplicates, lost, LLM requests again
    openie = work / "openie.json"
    out_docs = json.loads(openie.read_text())["docs"] if openie.exists() else []
    titles = Counter(doc["passage"].split("\n")[0] for doc in out_docs if "error" not in doc)
    asked = {stage: Counter(t for s in llms for (t, st), k in s.requests.items()
                            if st == stage for _ in range(k)) for stage in ("ner", "triples")}
    extract = {
        "rc": d.extract.rc, "passages": len(docs), "docs_out": len(out_docs),
        "failed_docs": sum("error" in doc for doc in out_docs),
        "duplicates": sum(k - 1 for k in titles.values()),
        "lost": sum(1 for p in docs if p["title"] not in titles),
        "asked_again": sum(k - 1 for k in asked["triples"].values()),  # triples requests
        "ner_asked_again": sum(k - 1 for k in asked["ner"].values()),
        "passages_at_kill": d.passages_at_kill, "wall_s": round(d.extract.seconds, 1),
    }

    # serve: the gap and what failed in it
    log = d.load.log
    back = d.replaced_at if d.replaced_at is not None else float("inf")
    in_gap = [r for r in log if d.killed_at <= r[0] < back]
    outside = [r for r in log if not d.killed_at <= r[0] < back]
    serve_fig = {
        "replicas": args.replicas, "clients": args.clients, "requests": len(log),
        "gap_s": round(back - d.killed_at, 1) if d.replaced_at is not None else None,
        "requests_in_gap": len(in_gap),
        # in the gap: answered (or failed) after the kill began, sent before the replacement;
        # a request in flight at the kill counts (it is the one a lost replica fails)
        "failed_in_gap": sum(r[3] != 200 and r[1] >= d.killed_at and r[0] < back for r in log),
        "failed": sum(r[3] != 200 for r in log),
        "failures": dict(Counter(str(r[3]) for r in log if r[3] != 200)),
        "latency_outside_gap": _ms([r[1] - r[0] for r in outside if r[3] == 200]),
        "latency_in_gap": _ms([r[1] - r[0] for r in in_gap if r[3] == 200]),
        "replaced": len(d.replicas_after - d.replicas_before) == 1,
    }
    record = {
        **provenance("bench_node_loss", threads=args.threads, device="cpu", git=git,
                     encoder_backend=requested_backend(args.encoder),
                     query_precision="float32",
                     batch_sizes={"retrieve_batch": 32, "retrieve_part": args.part_size,
                                  "extract_shard": args.shard_size, "extract_wave": 4},
                     optional_versions=("ray",)),
        "encoder": args.encoder, "nodes": "head (0 CPUs) + 2 workers (3 CPUs each), one host",
        "lost_node_ran": {ACTOR: d.lost[ACTOR], SHARD: d.lost[SHARD], REPLICA: d.lost[REPLICA]},
        "marks_s": {k: round(v, 1) for k, v in d.marks.items()},
        "retrieve": retrieve, "extract": extract, "serve": serve_fig,
        "cpu_shared": True, "loadavg_start": loadavg_start,
    }
    print(f"retrieve --ray: {retrieve}")
    print(f"extract --ray: {extract}")
    print(f"serve --ray: {serve_fig}")
    print(json.dumps(record))
    append_result_or_exit(Path(args.results or RESULTS / "bench_node_loss.jsonl"), record,
                          allow_dirty=args.allow_dirty)
    if d.retrieve.rc or d.extract.rc:
        raise SystemExit("a job failed:\n" + (d.retrieve.output + d.extract.output)[-3000:])


if __name__ == "__main__":
    main(_parse())
