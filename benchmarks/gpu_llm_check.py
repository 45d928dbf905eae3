"""GPU check of the LLM layer: OpenIE with the vLLM backend and a small local model.

    python -m benchmarks.gpu_llm_check [--model PATH_OR_ID] [--n 256]

Skips (exit 2, one "SKIP:" line: a skip never reads as a pass) when there is no CUDA device, no
vllm, no corpus, or no model on disk. The
machine has no network, so the model must already be there: --model, $HIPPO_VLLM_MODEL, a folder
under ./.models/, or a Hugging Face cache entry whose name says "instruct" (the smallest wins).
Prints passages/s, generated tokens/s and the parse success rate; appends a JSON line to
benchmarks/results/llm_extract.jsonl (see llm_extract_bench.py; a dirty git tree, or a copy without
git as on the device machine, needs --allow-dirty).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from benchmarks.common import (
    REPO,
    SKIP,
    DirtyTreeError,
    add_arguments,
    check_clean,
    data_root,
)

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/llm",)


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def find_model(explicit: str | None) -> str | None:
    """A small instruction model available offline, or None."""
    if explicit:
        return explicit
    if os.environ.get("HIPPO_VLLM_MODEL"):
        return os.environ["HIPPO_VLLM_MODEL"]
    candidates: list[Path] = []
    local = REPO / ".models"
    if local.is_dir():
        candidates += [p for p in local.iterdir() if (p / "config.json").exists()]
    hub = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"
    if hub.is_dir():
        for entry in hub.glob("models--*"):
            if "instruct" not in entry.name.lower():
                continue
            snaps = sorted((entry / "snapshots").glob("*/config.json"))
            if snaps:
                candidates.append(snaps[-1].parent)
    if not candidates:
        return None
    return str(min(candidates, key=_dir_size))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--n", type=int, default=256, help="passages of musique_train")
    ap.add_argument("--corpus", type=Path, default=None)
    ap.add_argument("--results", type=Path, default=None,
                    help="JSONL path (default benchmarks/results/llm_extract.jsonl)")
    add_arguments(ap)
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return SKIP
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("SKIP: vllm is not installed (pip install 'hippo-gpu[vllm]')")
        return SKIP
    model = find_model(args.model)
    if model is None:
        print("SKIP: no local instruction model (pass --model or set HIPPO_VLLM_MODEL)")
        return SKIP
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from benchmarks.llm_extract_bench import DEFAULT_OUT, run
    from hippo_gpu.llm.backends.vllm import VLLMBackend

    corpus = args.corpus or data_root() / "musique_train" / "corpus.json"
    if not corpus.exists():
        print(f"SKIP: corpus not found: {corpus} (set HIPPO_DATA_DIR)")
        return SKIP
    try:  # before loading the model: a refused line must not cost a model load
        check_clean(args.allow_dirty)
    except DirtyTreeError as e:
        print(f"FAIL: {e}")
        return 1
    print(f"vLLM {vllm.__version__} on {torch.cuda.get_device_name()} with {model}")
    backend = VLLMBackend(model, max_model_len=4096, gpu_memory_utilization=0.6)
    print(f"guided JSON decoding available: {backend.guided_available}")
    try:
        run(backend, min(8, args.n), corpus, None, label=f"vllm:{model} (warm-up)",
            device="cuda")
        run(backend, args.n, corpus, args.results or DEFAULT_OUT, label=f"vllm:{model}",
            allow_dirty=args.allow_dirty, device="cuda")
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
