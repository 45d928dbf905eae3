"""The `hippo-gpu` command line: one Typer app, one module per command group.

    demo               cli/demo.py       index the bundled sample and answer its questions
    corpus, index,     cli/index.py      a corpus file from a folder of text files; build an
    stats, insert,                       index; print its counts; insert or delete passages
    delete, compact                      (atomic commits); drop old versions
    eval               cli/evaluate.py   Recall@k, queries/s and stage times per mode
    retrieve, query    cli/retrieve.py   answer a query file in batches (resumable); one question
    extract, qa        cli/llm.py        LLM OpenIE extraction; retrieve-then-read QA
    serve              cli/serve.py      the HTTP query server
    mcp                cli/mcp.py        the MCP tools over stdio
"""

from __future__ import annotations

import typer

from hippo_gpu.cli import demo, evaluate, index, llm, mcp, retrieve, serve
from hippo_gpu.cli.common import CommandGroup

app = typer.Typer(cls=CommandGroup, add_completion=False, no_args_is_help=True,
                  help="HippoRAG (v1 and 2) retrieval as batched tensor work on CPU and CUDA.")
for _module in (demo, index, evaluate, retrieve, llm, serve, mcp):
    _module.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
