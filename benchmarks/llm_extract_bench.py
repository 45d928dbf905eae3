"""OpenIE extraction throughput of one LLM backend on the first N passages of a corpus.

    python -m benchmarks.llm_extract_bench --llm local:smollm2 --n 10
    python -m benchmarks.llm_extract_bench --llm openai:MODEL@http://host:8000/v1 --n 500

Prints passages/s, generated tokens/s and the parse success rate (accepted / parsed outputs)
beside failures by reason, and appends a JSON line to benchmarks/results/llm_extract.jsonl with
provenance.py's fields (``threads``: the local llama.cpp server's CPU threads, null for a remote
backend; ``precision`` and ``query_precision`` are null: no index, no query encoder; a dirty git
tree needs --allow-dirty). Every run starts from an empty cache, so it measures LLM work, not
cache hits.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS,
    DirtyTreeError,
    add_arguments,
    append_result,
    check_clean,
    data_root,
    provenance,
    skip,
)

# the code this benchmark's figures measure (benchmarks/performance_doc.py checks that no commit
# to it came after a quoted results line)
MEASURES = ("hippo_gpu/llm",)

DEFAULT_OUT = RESULTS / "llm_extract.jsonl"


def run(llm: Any, n: int, corpus_path: Path, out_jsonl: Path | None = DEFAULT_OUT,
        backend_options: dict[str, Any] | None = None, label: str | None = None, *,
        allow_dirty: bool = False, threads: int | None = None,
        device: str = "cpu") -> dict[str, Any]:
    """Extract the first `n` passages with `llm` (spec or Backend); return and record the row.

    `threads` and `device` describe where the LLM ran (for the record; `backend_options` is what
    configures it). Raises DirtyTreeError before any work if the row would be refused.
    """
    from hippo_gpu.llm.extract import extract_openie

    git = check_clean(allow_dirty) if out_jsonl is not None else None

    corpus = json.loads(corpus_path.read_text())[:n]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        report = extract_openie(corpus, llm, Path(tmp) / "openie.json",
                                backend_options=backend_options, show_progress=False)
        wall = time.perf_counter() - t0
        docs = json.loads((Path(tmp) / "openie.json").read_text())["docs"]
    parse = report.parse
    row = {
        **provenance("llm_extract", threads=threads, device=device, encoder_backend=None,
                     precision=None,
                     query_precision=None,
                     batch_sizes={"parallel_slots": (backend_options or {}).get("parallel")},
                     optional_versions=("hippo_gpu",), git=git),
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
    }
    print(f"{row['llm']}: {n} passages, {row['passages_per_s']:.3f} passages/s, "
          f"{row['tokens_per_s']:.1f} generated tokens/s, parse success "
          f"{row['parse_success']}, failed {row['failed']} {row['failures']}, "
          f"{row['triples_per_passage']} triples/passage")
    if out_jsonl is not None:
        append_result(out_jsonl, row, allow_dirty=allow_dirty)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llm", default="local:smollm2")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--corpus", type=Path, default=data_root() / "musique_train" / "corpus.json")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--parallel", type=int, default=1, help="local: llama.cpp server slots")
    ap.add_argument("--threads", type=int, default=1, help="local: llama.cpp CPU threads")
    add_arguments(ap)
    args = ap.parse_args()
    if not args.corpus.exists():
        skip(f"corpus not found: {args.corpus} (pass --corpus or set HIPPO_DATA_DIR)")
    local = args.llm.startswith("local:")
    options = {"parallel": args.parallel, "threads": args.threads} if local else None
    if local:
        print(f"local llama.cpp: {args.threads} thread(s), {args.parallel} slot(s)")
    try:
        run(args.llm, args.n, args.corpus, args.out, options, allow_dirty=args.allow_dirty,
            threads=args.threads if local else None, device="cpu" if local else "remote")
    except DirtyTreeError as e:
        sys.exit(str(e))


if __name__ == "__main__":
    main()
