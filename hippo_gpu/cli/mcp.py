"""`hippo-gpu mcp`: serve indexes to an MCP client over stdio (the client starts this command).

stdout carries the protocol, so everything else (loading messages, warnings) goes to stderr. The
same tools are mounted on `hippo-gpu serve` at /mcp (streamable HTTP); see hippo_gpu.serve.mcp.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path

import typer

from hippo_gpu.cli.reasoning import DATASET_HELP, PASSAGES_HELP, PROMPT_HELP, make_reasoner
from hippo_gpu.config import DEVICE_CHOICES
from hippo_gpu.serve.config import QueryLimits

__all__ = ["register"]

_LIMITS = QueryLimits()  # the flags' defaults


def register(app: typer.Typer) -> None:
    """Add the `mcp` command to the `hippo-gpu` Typer app."""
    app.command("mcp")(mcp)


def mcp(
    index: list[str] = typer.Option(
        ..., "--index", help="index directory, or NAME=DIR; repeat to serve several (the first "
                             "is the default)"),
    device: str = typer.Option("auto", help=f"one of {DEVICE_CHOICES} or e.g. cuda:1"),
    precision: str = typer.Option("float32", help="float32 | float16 | bfloat16"),
    query_backend: str = typer.Option("auto", help="query encoder: auto | torch | onnx"),
    threads: int | None = typer.Option(None, min=1, help="torch CPU threads (default: torch's)"),
    max_batch: int = typer.Option(64, min=1, help="most queries per batched retrieve (1: off)"),
    max_wait_ms: float = typer.Option(5.0, min=0.0, help="longest wait for a batch to fill"),
    max_queue: int = typer.Option(1024, min=1, help="most waiting queries; beyond: tool error"),
    max_query_chars: int = typer.Option(_LIMITS.max_query_chars, min=1,
                                        help="longer queries: tool error"),
    max_top_k: int = typer.Option(_LIMITS.max_top_k, min=1, help="larger top_k: tool error"),
    warmup: bool = typer.Option(True, help="load the encoder and solvers before answering"),
    llm: str | None = typer.Option(None, help="LLM writing IRCoT thoughts: adds the tool "
                                              "retrieve_ircot (thoughts cached beside the first "
                                              "index)"),
    max_ircot_steps: int = typer.Option(8, min=1, help="largest retrieve_ircot max_steps"),
    ircot_prompt: Path | None = typer.Option(None, help=PROMPT_HELP),
    dataset: str | None = typer.Option(None, help=DATASET_HELP),
    ircot_passages: int | None = typer.Option(None, min=0, help=PASSAGES_HELP),
) -> None:
    """Serve the MCP tools `retrieve`, `explain` and `stats` (with --llm also `retrieve_ircot`)
    and the resource passage://{key} over stdio."""
    try:
        import anyio

        from hippo_gpu.serve.mcp import serve_stdio
    except ImportError as e:
        raise typer.BadParameter(f"the mcp command needs the mcp extra: pip install "
                                 f"'hippo-gpu[mcp]' ({e})") from e
    from hippo_gpu.retrieval.options import SearcherOptions
    from hippo_gpu.retrieval.spec import SearcherSpec
    from hippo_gpu.serve.batcher import BatcherConfig
    from hippo_gpu.serve.holder import SearcherHolder
    from hippo_gpu.serve.service import RetrievalService, parse_index_specs

    try:
        specs = parse_index_specs(index)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    holders: dict[str, SearcherHolder] = {}  # each follows new versions (serve/holder.py)
    # Python-level prints while loading must not reach the protocol channel.
    with contextlib.redirect_stdout(sys.stderr):
        for name, path in specs.items():
            typer.echo(f"loading index {name!r} from {path} on {device} ...", err=True)
            try:
                holders[name] = SearcherHolder(SearcherSpec(
                    path, device=device, precision=precision, threads=threads, warm_up=warmup,
                    options=SearcherOptions(query_backend=query_backend)).open())
            except ValueError as e:
                raise typer.BadParameter(f"--index {path}: {e}") from e
            holders[name].follow()
    service = RetrievalService(holders, BatcherConfig(max_batch, max_wait_ms, max_queue))
    limits = QueryLimits(max_query_chars=max_query_chars, max_top_k=max_top_k)
    reasoner = None
    if llm is not None:
        first = next(iter(specs.values()))
        reasoner = make_reasoner(llm, first.parent / f"{first.name}.llm-cache.sqlite",
                                 dataset=dataset, prompt_file=ircot_prompt,
                                 max_passages=ircot_passages)
    try:
        anyio.run(functools.partial(serve_stdio, service, limits, reasoner=reasoner,
                                    max_ircot_steps=max_ircot_steps))
    finally:
        if reasoner is not None:
            reasoner.close()

