"""Child processes for tests/versions/test_writer_crashes.py and test_writer_lock.py: writers
that die mid-commit, or hold the lock.

    python tests/versions/writer_fault_child.py kill JOBS.json
        JOBS.json: {"jobs": [{"index_dir": ..., "step": ..., "compact"?: bool, "name"?: ...},
        ...], "compact"?: bool, "warm_model"?: bool, "corpus": passages JSON, "openie": OpenIE
        JSON, "cache_dir": embedding cache}. For each job a fresh process (a fork of this one)
        opens an IndexWriter on job["index_dir"], inserts the corpus and commits, with `on_step`
        calling os._exit(137) at job["step"] (of the commit, or with "compact" of the compaction
        after it): no `finally`, no atexit, no flush, as under SIGKILL. Prints one JSON line
        {name (default: step): exit status}.
    python tests/versions/writer_fault_child.py hold INDEX_DIR
        Opens an IndexWriter, prints "locked <pid>", and keeps the lock until stdin closes.

Why fork: a writer that commits an insert must load the encoder (new texts go through it, even
when the embedding cache answers), and importing sentence-transformers costs 10-20 s on a busy
2-core machine. This process pays that once; each killed writer is its own process (its own
open file descriptions, so its flock dies with it). The parent sets OMP_NUM_THREADS=1 and
TOKENIZERS_PARALLELISM=false, so no thread pool exists at fork time.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def _kill_jobs(spec_path: str) -> None:
    import torch

    from hippo_gpu.config import EncoderConfig
    from hippo_gpu.embed import Encoder
    from hippo_gpu.versions.writer import IndexWriter

    spec = json.loads(open(spec_path, encoding="utf-8").read())
    if spec.get("warm_model", True):  # false for an index whose encoder loads no model
        # warm the imports and the model files once; each writer still loads its own encoder
        Encoder(EncoderConfig(), torch.device("cpu"), cache_dir=spec["cache_dir"])
    status: dict[str, int] = {}
    for job in spec["jobs"]:
        pid = os.fork()
        if pid == 0:
            try:
                def die_at(name: str, target: str = job["step"]) -> None:
                    if name == target:
                        os._exit(137)

                # kill the compaction, not the commit (per job, or for every job)
                compact = bool(job.get("compact", spec.get("compact")))
                w = IndexWriter(job["index_dir"], device="cpu", cache_dir=spec["cache_dir"],
                                on_step=None if compact else die_at,
                                compact_after=None if compact else 16).open()
                w.insert(spec["corpus"], spec["openie"])
                w.commit()
                if compact:
                    w.on_step = die_at
                    w.compact()
                os._exit(0)  # the step was never reached
            except BaseException:  # noqa: BLE001 - report and exit without cleanup
                traceback.print_exc()
                sys.stderr.flush()
                os._exit(1)
        _, code = os.waitpid(pid, 0)
        status[job.get("name", job["step"])] = os.waitstatus_to_exitcode(code)
    print(json.dumps(status), flush=True)


def _hold(index_dir: str) -> None:
    from hippo_gpu.versions.writer import IndexWriter

    with IndexWriter(index_dir, device="cpu"):
        print(f"locked {os.getpid()}", flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    if sys.argv[1] == "kill":
        _kill_jobs(sys.argv[2])
    elif sys.argv[1] == "hold":
        _hold(sys.argv[2])
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}")
