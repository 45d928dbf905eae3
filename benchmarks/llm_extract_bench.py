"""OpenIE extraction throughput of one LLM backend on the first N passages of a corpus.

    python benchmarks/llm_extract_bench.py --llm local:smollm2 --n 10
    python benchmarks/llm_extract_bench.py --llm openai:MODEL@http://host:8000/v1 --n 500

Prints passages/s, generated tokens/s and the parse success rate (accepted / parsed outputs)
beside failures by reason, and appends a JSON line to benchmarks/results/llm_extract.jsonl.
Every run starts from an empty cache, so it measures LLM work, not cache hits.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATA = Path(os.environ.get("HIPPO_DATA_DIR", REPO.parent / "shared" / "data"))
DEFAULT_OUT = REPO / "benchmarks" / "results" / "llm_extract.jsonl"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run(llm: Any, n: int, corpus_path: Path, out_jsonl: Path | None = DEFAULT_OUT,
        backend_options: dict[str, Any] | None = None, label: str | None = None) -> dict[str, Any]:
    """Extract the first `n` passages with `llm` (spec or Backend); return and record the row."""
    from hippo_gpu.llm.extract import extract_openie

    corpus = json.loads(corpus_path.read_text())[:n]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        report = extract_openie(corpus, llm, Path(tmp) / "openie.json",
                                backend_options=backend_options, show_progress=False)
        wall = time.perf_counter() - t0
        docs = json.loads((Path(tmp) / "openie.json").read_text())["docs"]
    parse = report.parse
    row = {
        "bench": "llm_extract",
        "llm": label or (llm if isinstance(llm, str) else llm.model),
        "passages": n,
        "extracted": report.done,
        "failed": report.failed,
        "failures": dict(report.failures),
        "parse_success": round(parse.accepted / parse.total, 4) if parse.total else None,
        "parse": parse.as_dict(),
        "passages_per_s": round(report.passages_per_s, 4),
        "tokens_per_s": round(report.tokens_per_s, 2),
        "prompt_tokens": report.prompt_tokens,
        "completion_tokens": report.completion_tokens,
        "seconds": round(report.seconds, 2),
        "wall_s_with_startup": round(wall, 2),
        "triples_per_passage": round(sum(len(d["extracted_triples"]) for d in docs) / n, 2),
        "commit": _commit(),
        "host": platform.node(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(f"{row['llm']}: {n} passages, {row['passages_per_s']:.3f} passages/s, "
          f"{row['tokens_per_s']:.1f} generated tokens/s, parse success "
          f"{row['parse_success']}, failed {row['failed']} {row['failures']}, "
          f"{row['triples_per_passage']} triples/passage")
    if out_jsonl is not None:
        out_jsonl.parent.mkdir(parents=True, exist_ok=True)
        with open(out_jsonl, "a") as f:
            f.write(json.dumps(row) + "\n")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llm", default="local:smollm2")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--corpus", type=Path, default=DATA / "musique_train" / "corpus.json")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--parallel", type=int, default=1, help="local: llama.cpp server slots")
    args = ap.parse_args()
    if not args.corpus.exists():
        sys.exit(f"corpus not found: {args.corpus} (set HIPPO_DATA_DIR)")
    options = {"parallel": args.parallel} if args.llm.startswith("local:") else None
    run(args.llm, args.n, args.corpus, args.out, options)


if __name__ == "__main__":
    main()
