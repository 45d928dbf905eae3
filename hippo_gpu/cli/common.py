"""What every command shares: consoles, thread set-up, error exit (one handler of HippoGpuError
for the whole app), tables."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from hippo_gpu.errors import HippoGpuError

if TYPE_CHECKING:
    from hippo_gpu.retrieval.modes import Mode

console = Console()
err_console = Console(stderr=True, soft_wrap=True)

LLM_HELP = ("LLM: openai:MODEL@http://host:port/v1 | vllm:MODEL | local:smollm2 (a tiny "
            "pipeline demo: its output is unreliable)")
ENCODER_HELP = ("sentence-transformers name or path, openai:MODEL@http://host:port/v1 (an "
                "OpenAI-compatible embeddings server: vLLM, TEI, Ollama, OpenAI; openai:MODEL "
                "takes the URL from $OPENAI_BASE_URL, the key from $OPENAI_API_KEY), or hash:D "
                "(weightless test encoder, e.g. hash:64)")
QUERY_ENCODER_HELP = ("query encoder (default: the index's own); for an index built with "
                      "openai:MODEL, openai:MODEL@URL queries that model at URL")


def setup(threads: int | None, verbose: bool = False) -> int:
    """Logging level and CPU threads (torch and faiss); returns the thread count in force."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    from hippo_gpu.device import set_threads

    n = set_threads(threads)
    try:
        import faiss

        faiss.omp_set_num_threads(n)
    except ImportError:
        pass
    return n


def fail(msg: str) -> NoReturn:
    """Print an error and exit with status 2 (the message is text: a path or title holding
    "[/x]" is printed as it is, not read as console markup)."""
    err_console.print(f"[bold red]error:[/] {escape(msg)}")
    raise typer.Exit(2)


def parse_mode(name: str) -> Mode:
    """The Mode a --mode option names, parsed once where the command starts; a one-line error
    naming the modes otherwise."""
    from hippo_gpu.retrieval.modes import mode_of

    try:
        return mode_of(name.strip())
    except ValueError as e:
        fail(str(e))


def folder_hint(corpus: Path) -> str:
    """The error for a folder given as --corpus: how to make a corpus file of it."""
    return (f"--corpus {corpus} is a folder; make a corpus file of its text files first: "
            f"hippo-gpu corpus {corpus} --out corpus.json")


def note_local_llm(llm: str) -> None:
    """One line on stderr when OpenIE is about to be extracted with a bundled local model
    (`local:NAME`, alone or in a comma-separated list): a pipeline demo whose triples are
    often invented, never an index to rely on."""
    local = [s.strip() for s in llm.split(",") if s.strip().startswith("local:")]
    if local:
        from hippo_gpu.llm.backends.llamacpp import DEMO_NOTICE

        err_console.print(escape(DEMO_NOTICE.format(spec=local[0])), highlight=False)


def ray_failure(e: BaseException) -> str:
    """A failed Ray job's message for the user: the error's first line (Ray appends the remote
    traceback), and that a rerun resumes."""
    first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
    return (f"the Ray job failed: {type(e).__name__}: {first[:300]}; what was committed is kept, "
            "run the same command again to finish")


class CommandGroup(TyperGroup):
    """The app's command group: a HippoGpuError out of any command is the user's to fix and
    says how, so it ends the command as `fail` does (its message, exit status 2), not as a
    traceback. Builtin errors stay with the commands, which know when one is the user's."""

    def invoke(self, ctx: Any) -> Any:  # a click Context (newer typer vendors its own click)
        try:
            return super().invoke(ctx)
        except HippoGpuError as e:
            fail(str(e))


def timing_table(timings: dict[str, float], title: str) -> Table:
    table = Table(title=title)
    table.add_column("stage")
    table.add_column("seconds", justify="right")
    for k, v in timings.items():
        table.add_row(k, f"{v:.3f}")
    table.add_row("[bold]total", f"[bold]{sum(timings.values()):.3f}")
    return table
