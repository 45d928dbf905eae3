"""Index builds through a loopback embeddings server vs the local encoder, same model, one run.

Providers, each building the same corpus with no embedding cache (every text embedded each
build), in alternating rounds so a load change on a shared machine hits both alike:

    local    the default encoder (bundled all-MiniLM-L6-v2) in this process, torch float32
    server   `--encoder openai:all-MiniLM-L6-v2@http://127.0.0.1:PORT/v1`: the tests' loopback
             FastAPI server (tests/embed/embedding_server.py, a subprocess on this machine)
             computing the same model's vectors with the same thread count, reached through
             hippo_gpu's OpenAI-compatible client (batched by token budget, `--concurrency`
             requests in flight)

Per provider: the embedding stages of build_index (embed_passages + embed_phrases + embed_facts,
wall seconds, median with p20-p80 over `--rounds` builds after one untimed build that loads the
model), texts per second, and the whole build. The local encoder's model load is a one-off,
reported apart. Quality beside speed: the server-built index against the local one (same counts,
same synonym edges, max |difference| of the embeddings). Both processes run with
OMP_WAIT_POLICY=PASSIVE (unless set). Both providers share the CPU: the server
process does the model's work while this one waits on HTTP, so the ratio is the cost of the HTTP
path (JSON floats, requests) on one machine, not of a remote GPU server.

    python -m benchmarks.bench_remote_encoder --threads 2
    python -m benchmarks.bench_remote_encoder --threads 2 --corpus musique --passages 300
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import (
    REPO,
    RESULTS,
    add_arguments,
    append_result_or_exit,
    check_clean_or_exit,
    init_threads,
    musique_dir,
    musique_openie,
    provenance,
    skip,
    subprocess_env,
    summarize,
)

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/embed", "hippo_gpu/indexing", "hippo_gpu/storage", "hippo_gpu/config.py")

EMBED_STAGES = ("embed_passages", "embed_phrases", "embed_facts")


def _parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, required=True,
                    help="torch threads of this process and of the server process")
    ap.add_argument("--corpus", choices=("sample", "musique"), default="sample")
    ap.add_argument("--passages", type=int, default=None,
                    help="musique: the first N corpus passages (default: all 1,890)")
    ap.add_argument("--rounds", type=int, default=3, help="timed builds per provider")
    ap.add_argument("--concurrency", type=int, default=4, help="server requests in flight")
    ap.add_argument("--results", default=None,
                    help="JSONL path (default benchmarks/results/bench_remote_encoder.jsonl)")
    add_arguments(ap)
    return ap.parse_args(argv)


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:  # thread env for OpenMP/BLAS must be set before numpy/torch load
    # Idle OpenMP threads sleep instead of spinning, in both processes: the server runs the
    # model on a worker thread beside its event loop's, and spinning threads of a second team
    # halved its speed on 2 cores (measured), a cost of the test server, not of the HTTP path.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    init_threads(ARGS.threads)


def _corpus(args: argparse.Namespace) -> tuple[list[dict[str, Any]], Path]:
    if args.corpus == "sample":
        from hippo_gpu.sample import paths

        files = paths()
        return json.loads(Path(files["corpus"]).read_text()), Path(files["openie"])
    data = musique_dir()
    openie = musique_openie(data)
    if openie is None:
        skip(f"no MuSiQue OpenIE file in {data}")
    corpus = json.loads((data / "corpus.json").read_text())
    return corpus[:args.passages] if args.passages else corpus, openie


def _start_server(threads: int) -> tuple[subprocess.Popen, str]:
    try:
        import fastapi  # noqa: F401
        import httpx
        import uvicorn  # noqa: F401
    except ImportError as e:
        skip(f"the loopback server needs fastapi, uvicorn and httpx: {e}")
    proc = subprocess.Popen([sys.executable, "-m", "tests.embed.embedding_server", "--vectors",
                             "minilm"], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env=subprocess_env(threads))
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        skip(f"the loopback embeddings server did not start ({line.strip()!r})")
    url = f"http://127.0.0.1:{int(line.split()[1])}"
    deadline = time.monotonic() + 120
    while True:  # the port is bound before the app serves: wait for an answer
        try:
            httpx.get(url + "/docs", timeout=1)
            return proc, url + "/v1"
        except httpx.TransportError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                skip("the loopback embeddings server never answered")
            time.sleep(0.1)


def main() -> None:
    args = ARGS or _parse()
    git = check_clean_or_exit(args.allow_dirty)
    import torch

    from hippo_gpu import build_index
    from hippo_gpu.config import EncoderConfig, RemoteEncoderConfig

    corpus, openie = _corpus(args)
    proc, url = _start_server(args.threads)
    remote = RemoteEncoderConfig(concurrency=args.concurrency)
    encoders = {"local": EncoderConfig(),
                "server": EncoderConfig(model=f"openai:all-MiniLM-L6-v2@{url}", remote=remote)}
    samples: dict[str, list[float]] = {k: [] for k in encoders}
    totals: dict[str, list[float]] = {k: [] for k in encoders}
    first: dict[str, dict[str, float]] = {}
    built: dict[str, Any] = {}
    try:
        for r in range(args.rounds + 1):  # round 0: untimed (model loads, connections open)
            for name in (encoders if r % 2 == 0 else reversed(list(encoders))):
                index = build_index(corpus, openie, None, device="cpu",
                                    encoder=encoders[name], cache_dir=None)
                embed = sum(index.timings.get(s, 0.0) for s in EMBED_STAGES)
                if r == 0:
                    first[name], built[name] = dict(index.timings), index
                else:
                    samples[name].append(embed)
                    totals[name].append(sum(index.timings.values()))
    finally:
        proc.kill()
        proc.wait(10)
    local, server = built["local"], built["server"]
    texts = len(set(local.passage_texts)) + len(local.phrases) + len(local.facts)
    same_counts = {k: v for k, v in server.stats().items() if k not in ("encoder",
                                                                         "basis_seconds")} == \
        {k: v for k, v in local.stats().items() if k not in ("encoder", "basis_seconds")}
    same_synonyms = bool(torch.equal(server.synonym_src, local.synonym_src)
                         and torch.equal(server.synonym_dst, local.synonym_dst))
    max_diff = max(float((getattr(server, e) - getattr(local, e)).abs().max())
                   for e in ("passage_emb", "phrase_emb", "fact_emb"))
    rows = []
    print(f"{args.corpus}: {len(corpus)} passages, {texts} texts per build, {args.threads} "
          f"threads, {args.rounds} rounds; server concurrency {args.concurrency}")
    print(f"{'provider':8} {'embed s (p20-p80)':>24} {'texts/s':>9} {'build s':>8}")
    for name in encoders:
        t = summarize(sum(first[name].get(s, 0.0) for s in EMBED_STAGES), samples[name])
        build = summarize(0.0, totals[name])
        rows.append({"provider": name, "embed_s": t.median, "embed_p20_s": t.p20,
                     "embed_p80_s": t.p80, "texts_per_s": texts / t.median,
                     "build_s": build.median, "rounds": t.runs})
        print(f"{name:8} {t.median:10.3f} ({t.p20:.3f}-{t.p80:.3f}) {texts / t.median:9.0f} "
              f"{build.median:8.3f}")
    ratio = rows[1]["embed_s"] / rows[0]["embed_s"]
    print(f"server / local embed time: {ratio:.2f}x; local model load (one-off) "
          f"{first['local'].get('load_encoder', 0.0):.2f} s; same counts {same_counts}, same "
          f"synonym edges {same_synonyms}, max |e_server - e_local| {max_diff:.2e}")
    record = {**provenance("remote_encoder", threads=args.threads, device="cpu", git=git,
                           encoder_backend=["torch", "openai"],
                           batch_sizes={"encoder_batch_size": EncoderConfig.batch_size,
                                        "max_batch_texts": remote.max_batch_texts,
                                        "max_batch_tokens": remote.max_batch_tokens,
                                        "concurrency": remote.concurrency},
                           optional_versions=("httpx", "fastapi", "uvicorn")),
              "corpus": args.corpus, "passages": len(corpus), "texts": texts, "rows": rows,
              "server_over_local": ratio, "same_counts": same_counts,
              "same_synonym_edges": same_synonyms, "max_abs_embedding_diff": max_diff,
              "local_load_encoder_s": first["local"].get("load_encoder"),
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
    out = append_result_or_exit(args.results or RESULTS / "bench_remote_encoder.jsonl", record,
                                allow_dirty=args.allow_dirty)
    print(f"appended to {out}")


if __name__ == "__main__":
    main()
