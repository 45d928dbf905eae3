"""`hippo-gpu index` (build an index) and `hippo-gpu stats` (its counts)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from hippo_gpu.cli.common import LLM_HELP, cache_root, console, fail, setup, timing_table
from hippo_gpu.config import EncoderConfig, GraphConfig


def index(
    corpus: Path = typer.Option(..., help="corpus JSON: list of {title, text}"),
    out: Path = typer.Option(..., help="index directory to write (atomically)"),
    openie: Path | None = typer.Option(None, help="OpenIE JSON (HippoRAG v1 or v2 format)"),
    llm: str | None = typer.Option(None, help="extract OpenIE first with this " + LLM_HELP),
    encoder: str = typer.Option(EncoderConfig.model, help="sentence-transformers name or path"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    threads: int | None = typer.Option(None, help="CPU threads (torch and faiss)"),
    precision: str = typer.Option("float32", help="encoder precision: float32 | bfloat16"),
    knn_backend: str = typer.Option("auto", help="auto | faiss-flat | faiss-hnsw | faiss-ivf | "
                                                 "faiss-gpu | torch"),
    allow_missing_openie: bool = typer.Option(
        False, help="index corpus passages the OpenIE file lacks, without triples"),
    cache_dir: Path | None = typer.Option(None, help="embedding cache (default: "
                                                        "$HIPPO_GPU_CACHE/embeddings)"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Build an index from a corpus and its OpenIE output (or extract it with --llm first)."""
    from hippo_gpu.build import build_index
    from hippo_gpu.data import DataFormatError, as_passages

    n = setup(threads, verbose)
    if (openie is None) == (llm is None):
        fail("give exactly one of --openie FILE or --llm SPEC")
    try:
        passages = as_passages(corpus)  # read once, for extraction and for the build
    except (DataFormatError, OSError) as e:
        fail(str(e))
    if llm is not None:
        from hippo_gpu.llm.extract import extract_openie

        openie = out.parent / f"{out.name}.openie.json"
        console.print(f"extracting OpenIE with {llm} -> {openie}")
        report = extract_openie(passages, llm, openie,
                                cache_path=cache_root() / "llm_cache.sqlite")
        console.print(str(report))
    assert openie is not None  # one of the two branches above set it
    try:
        idx = build_index(
            passages, openie, out,
            encoder=EncoderConfig(model=encoder, precision=precision),
            device=device, graph=GraphConfig(knn_backend=knn_backend),
            cache_dir=cache_dir or cache_root() / "embeddings",
            allow_missing_openie=allow_missing_openie, show_progress=True,
        )
    except (DataFormatError, ValueError) as e:
        fail(str(e))
    console.print(timing_table(idx.timings, f"index built in {out} ({n} threads)"))
    console.print_json(json.dumps(idx.stats()))


def stats(path: Path = typer.Argument(..., help="index directory"),
          as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Print an index's counts (upstream graph_info definitions)."""
    from hippo_gpu.index import IndexFormatError, load_index

    try:
        s = load_index(path, device="cpu").stats()
    except IndexFormatError as e:
        fail(str(e))
    if as_json:
        print(json.dumps(s))
        return
    table = Table(title=str(path))
    table.add_column("count")
    table.add_column("value", justify="right")
    for k, v in s.items():
        table.add_row(k, str(v))
    console.print(table)




def register(app: typer.Typer) -> None:
    app.command()(index)
    app.command()(stats)
