"""`hippo-gpu retrieve`: answer a file of queries in batches (resumable; see hippo_gpu.batch)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from hippo_gpu.cli.common import console, fail, setup
from hippo_gpu.config import MODES

if TYPE_CHECKING:
    from hippo_gpu.searcher_spec import SearcherSpec


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
                                      "fused_ranks; hippo_gpu.batch)"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    precision: str = typer.Option("float32", help="float32 | float16 | bfloat16"),
    threads: int | None = typer.Option(None, help="CPU threads (with --ray: per worker)"),
    ray: str | None = typer.Option(None, "--ray", metavar="ADDRESS|local",
                                   help="run on Ray: 'local' starts a Ray instance here, "
                                        "'auto' or ray://HOST:PORT joins a cluster; the index, "
                                        "queries and OUT must be on storage every node reads"),
    workers: int = typer.Option(1, min=1, help="--ray: actors, each holding one index replica"),
    cpus_per_worker: float = typer.Option(1.0, min=0.0, help="--ray: Ray CPUs per actor"),
    num_gpus_per_worker: float = typer.Option(0.0, min=0.0, help="--ray: GPUs per actor"),
) -> None:
    """Retrieve for every row of a query file; rerun after a crash to finish the same file.

    With --ray the rows are answered by a pool of Ray actors (hippo_gpu.distributed.ray_batch:
    same output; worker failures are retried; after a crash of this process, rerun the same
    command and it continues from the committed parts, as the local one).
    """
    from hippo_gpu.batch import retrieve_file
    from hippo_gpu.searcher_spec import SearcherSpec

    n = setup(threads)
    if mode not in MODES:
        fail(f"unknown mode {mode!r}; choose from {MODES}")
    try:
        spec = SearcherSpec(index, device=device, precision=precision, threads=threads)
    except ValueError as e:
        fail(str(e))
    if ray is not None and explain:
        fail("--explain runs locally: drop --ray")
    if ray is not None:
        _retrieve_ray(ray, spec, queries, out, mode=mode, top_k=top_k, batch_size=batch_size,
                      part_size=part_size, skip_bad=skip_bad, workers=workers,
                      cpus_per_worker=cpus_per_worker, gpus_per_worker=num_gpus_per_worker)
        return
    try:
        searcher = spec.open()
        report = retrieve_file(searcher, queries, out, mode=mode, top_k=top_k,
                               batch_size=batch_size, part_size=part_size, skip_bad=skip_bad,
                               explain=explain)
    except (FileNotFoundError, ImportError, ValueError) as e:
        fail(str(e))
    console.print(f"{report.rows} rows -> {out}: {report.answered} answered, {report.resumed} "
                  f"from committed parts, {report.bad} malformed, {report.failed} failed"
                  + (f" (see {report.bad_file})" if report.bad_file else "")
                  + f"; {report.queries_per_s:.1f} queries/s, {n} threads")


def _retrieve_ray(address: str, spec: SearcherSpec, queries: Path, out: Path, *, mode: str,
                  top_k: int, batch_size: int, part_size: int, skip_bad: bool, workers: int,
                  cpus_per_worker: float, gpus_per_worker: float) -> None:
    try:
        from hippo_gpu.distributed.cluster import connect
        from hippo_gpu.distributed.ray_batch import retrieve_ray

        started = connect(address)
    except (ImportError, ConnectionError, RuntimeError) as e:
        fail(f"cannot use Ray at {address!r}: {e}")
    import ray

    per_worker = spec.threads or max(1, round(cpus_per_worker))
    try:
        report = retrieve_ray(replace(spec, threads=per_worker), queries, out, workers=workers,
                              cpus_per_worker=cpus_per_worker, gpus_per_worker=gpus_per_worker,
                              mode=mode, top_k=top_k, batch_size=batch_size,
                              part_size=part_size, skip_bad=skip_bad, show_progress=True)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    finally:
        if started:
            ray.shutdown()
    console.print(f"{report.rows} rows -> {out}: {report.answered} answered, {report.resumed} "
                  f"from committed parts, {report.bad} malformed"
                  + (f" (see {report.bad_file})" if report.bad_file else "")
                  + f"; {report.queries_per_s:.1f} queries/s (Ray: {workers} workers x "
                  f"{per_worker} threads, actor start included)")


def register(app: typer.Typer) -> None:
    app.command()(retrieve)
