"""`hippo-gpu retrieve`: answer a file of queries in batches (resumable; see retrieval/batch.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from hippo_gpu.cli.common import (
    LLM_HELP,
    QUERY_ENCODER_HELP,
    console,
    fail,
    ray_failure,
    setup,
)
from hippo_gpu.cli.reasoning import (
    DATASET_HELP,
    MAX_STEPS_HELP,
    PASSAGES_HELP,
    PROMPT_HELP,
    check_max_steps,
    make_reasoner,
)
from hippo_gpu.config import MODES

if TYPE_CHECKING:
    from hippo_gpu.retrieval.spec import SearcherSpec


def retrieve(
    index: Path = typer.Option(..., help="index directory"),
    queries: Path = typer.Option(..., help='queries: JSON Lines or Parquet rows {"id", "query"'
                                           ', "entities"?}'),
    out: Path = typer.Option(..., help="output .jsonl or .parquet: {id, keys, titles, scores}"),
    mode: str = typer.Option("hipporag2", help=f"one of {MODES}"),
    top_k: int = typer.Option(10, min=1, help="passages per query"),
    batch_size: int = typer.Option(64, min=1, help="queries per batched retrieval"),
    part_size: int = typer.Option(4096, min=1, help="rows per committed output part"),
    skip_bad: bool = typer.Option(False, help="record malformed rows in OUT.bad.jsonl instead "
                                              "of stopping at the first"),
    explain: bool = typer.Option(False, "--explain",
                                 help="add each hit's score split by seed (columns seeds, "
                                      "contributions, dense, offset, value, bound, "
                                      "fused_ranks; hippo_gpu.retrieval.batch)"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    encoder: str | None = typer.Option(None, help=QUERY_ENCODER_HELP),
    precision: str = typer.Option("float32", help="float32 | float16 | bfloat16"),
    threads: int | None = typer.Option(None, help="CPU threads (with --ray: per worker)"),
    ray: str | None = typer.Option(None, "--ray", metavar="ADDRESS|local",
                                   help="run on Ray: 'local' starts a Ray instance here, "
                                        "'auto' or ray://HOST:PORT joins a cluster; the index, "
                                        "queries and OUT must be on storage every node reads"),
    workers: int = typer.Option(1, min=1, help="--ray: actors, each holding one index replica"),
    cpus_per_worker: float = typer.Option(1.0, min=0.0, help="--ray: Ray CPUs per actor"),
    num_gpus_per_worker: float = typer.Option(0.0, min=0.0, help="--ray: GPUs per actor"),
    ircot: bool = typer.Option(False, "--ircot", help="IRCoT rows (retrieval/ircot.py): "
                               "--llm writes the thoughts, kept in each row"),
    max_steps: int = typer.Option(3, help=MAX_STEPS_HELP),
    llm: str | None = typer.Option(None, help=f"--ircot: {LLM_HELP}"),
    llm_cache: Path | None = typer.Option(
        None, help="--ircot: SQLite cache of the thoughts (default: OUT.llm-cache.sqlite; a "
                   "resumed run reads its thoughts back from it)"),
    ircot_prompt: Path | None = typer.Option(None, help=PROMPT_HELP),
    dataset: str | None = typer.Option(None, help=DATASET_HELP),
    ircot_passages: int | None = typer.Option(None, min=0, help=PASSAGES_HELP),
) -> None:
    """Retrieve for every row of a query file; rerun after a crash to finish the same file.

    With --ray the rows are answered by a pool of Ray actors (hippo_gpu.distributed.ray_batch:
    same output; worker failures are retried; after a crash of this process, rerun the same
    command and it continues from the committed parts, as the local one).
    """
    o = RetrieveOptions(
        index=index, queries=queries, out=out, mode=mode, top_k=top_k, batch_size=batch_size,
        part_size=part_size, skip_bad=skip_bad, explain=explain, device=device, encoder=encoder,
        precision=precision, threads=threads, ray=ray, workers=workers,
        cpus_per_worker=cpus_per_worker, num_gpus_per_worker=num_gpus_per_worker, ircot=ircot,
        max_steps=max_steps, llm=llm, llm_cache=llm_cache, ircot_prompt=ircot_prompt,
        dataset=dataset, ircot_passages=ircot_passages)
    n = setup(o.threads)
    spec = _checked_spec(o)
    if o.ray is not None:
        _retrieve_ray(o, spec)
    else:
        _retrieve_here(o, spec, threads=n)


@dataclass(frozen=True)
class RetrieveOptions:
    """What `hippo-gpu retrieve` was asked, one field per option (the command's help says
    each)."""

    index: Path
    queries: Path
    out: Path
    mode: str
    top_k: int
    batch_size: int
    part_size: int
    skip_bad: bool
    explain: bool
    device: str
    encoder: str | None
    precision: str
    threads: int | None
    ray: str | None
    workers: int
    cpus_per_worker: float
    num_gpus_per_worker: float
    ircot: bool
    max_steps: int
    llm: str | None
    llm_cache: Path | None
    ircot_prompt: Path | None
    dataset: str | None
    ircot_passages: int | None


def _checked_spec(o: RetrieveOptions) -> SearcherSpec:
    """The searcher to open, once the options are known to go together."""
    from hippo_gpu.retrieval.spec import SearcherSpec

    if o.mode not in MODES:
        fail(f"unknown mode {o.mode!r}; choose from {MODES}")
    try:
        spec = SearcherSpec(o.index, device=o.device, precision=o.precision, threads=o.threads,
                            encoder_model=o.encoder)
    except ValueError as e:
        fail(str(e))
    if o.ircot and o.ray is not None:
        fail("--ircot does not run on --ray; run it here")
    if o.ray is not None and o.explain:
        fail("--explain runs locally: drop --ray")
    if o.ircot and o.explain:
        fail("--explain explains one-step retrieval: drop --ircot or --explain")
    return spec


def _retrieve_here(o: RetrieveOptions, spec: SearcherSpec, *, threads: int) -> None:
    """The query file answered in this process (retrieval/batch.py), IRCoT rows with --ircot."""
    from hippo_gpu.retrieval.batch import retrieve_file

    options = None
    if o.ircot:
        from hippo_gpu.retrieval.ircot import IRCoTOptions

        if o.llm is None:
            fail("--ircot needs --llm SPEC (the LLM that writes the thoughts)")
        reasoner = make_reasoner(
            o.llm, o.llm_cache or o.out.with_name(o.out.name + ".llm-cache.sqlite"),
            dataset=o.dataset, prompt_file=o.ircot_prompt, max_passages=o.ircot_passages)
        options = IRCoTOptions(reasoner, check_max_steps(o.max_steps))
    try:
        searcher = spec.open()
        report = retrieve_file(searcher, o.queries, o.out, mode=o.mode, top_k=o.top_k,
                               batch_size=o.batch_size, part_size=o.part_size,
                               skip_bad=o.skip_bad, ircot=options, explain=o.explain)
    except (FileNotFoundError, ImportError, ValueError) as e:
        fail(str(e))
    finally:
        if options is not None:
            reasoner.close()
    console.print(f"{report.rows} rows -> {o.out}: {report.answered} answered, {report.resumed} "
                  f"from committed parts, {report.bad} malformed, {report.failed} failed"
                  + (f" (see {report.bad_file})" if report.bad_file else "")
                  + f"; {report.queries_per_s:.1f} queries/s, {threads} threads")


def _retrieve_ray(o: RetrieveOptions, spec: SearcherSpec) -> None:
    """The query file answered by a pool of Ray actors (hippo_gpu.distributed.ray_batch)."""
    assert o.ray is not None
    try:
        from hippo_gpu.distributed.cluster import connect
        from hippo_gpu.distributed.ray_batch import retrieve_ray

        started = connect(o.ray)
    except (ImportError, ConnectionError, RuntimeError) as e:
        fail(f"cannot use Ray at {o.ray!r}: {e}")
    import ray

    per_worker = spec.threads or max(1, round(o.cpus_per_worker))
    try:
        report = retrieve_ray(replace(spec, threads=per_worker), o.queries, o.out,
                              workers=o.workers, cpus_per_worker=o.cpus_per_worker,
                              gpus_per_worker=o.num_gpus_per_worker, mode=o.mode,
                              top_k=o.top_k, batch_size=o.batch_size, part_size=o.part_size,
                              skip_bad=o.skip_bad, show_progress=True)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    except ray.exceptions.RayError as e:  # e.g. every restart of an actor spent
        fail(ray_failure(e))
    finally:
        if started:
            ray.shutdown()
    console.print(f"{report.rows} rows -> {o.out}: {report.answered} answered, {report.resumed} "
                  f"from committed parts, {report.bad} malformed"
                  + (f" (see {report.bad_file})" if report.bad_file else "")
                  + f"; {report.queries_per_s:.1f} queries/s (Ray: {o.workers} workers x "
                  f"{per_worker} threads, actor start included)")


def register(app: typer.Typer) -> None:
    app.command()(retrieve)
