"""Batch retrieval of a query file on a Ray cluster (`hippo-gpu retrieve --ray`).

Same input and output as hippo_gpu.batch (the local command): rows {"id", "query",
"entities"?} as JSON Lines or Parquet in; {"id", "keys", "titles", "scores"} per row, in input
order, out, JSON Lines or Parquet by OUT's suffix. The answers equal the local command's (same
keys in the same order; scores equal up to float rounding of a different batch composition).

Data flow (Ray Data, streaming; blocks move through the object store, not the driver):

    read        JSON Lines: read_text (one row per line, blank lines kept so that a line's
                position is its line number); Parquet: read_parquet
    _order      monotonically_increasing_id: increasing in input position (execution keeps the
                input order, so task ids follow it); the join sorts and ranks by it
    parse       _Parse (a light task): each row checked by hippo_gpu.batch.check_row, the
                local command's rule; blocks cut to batch_size rows (a generator map), so one
                large file is spread over the whole pool instead of landing on one actor
    answer      map_batches(IndexActor, ActorPoolStrategy(size=N)): each actor loads the index
                ONCE (load_index + Searcher in __init__) and answers batch_size rows per call
                with hippo_gpu.batch.answer_rows, the local command's code
    commit      write_datasink(_PartSink): every output block becomes OUT.parts/part-<first
                _order>.parquet, written to a temporary name and renamed
    join        the driver reads the parts in _order (a manifest of the committed parts comes
                back from the sink; parts whose ranges overlap are merged), refuses a position
                seen twice, and writes OUT with hippo_gpu.batch.write_answers (atomic, the
                local format), then removes OUT.parts

Retries and exactly-once. An actor that dies (killed, OOM, os._exit) is restarted by Ray up to
`max_restarts` times and its in-flight batches are resubmitted (`max_task_retries`); a batch's
output block exists only once its task returned, so a retried batch is counted once. A write
task that dies is retried by Ray Data; its parts are named by their first input position, so a
retry renames identical content over the same name. The join uses only the manifest of the
write tasks that succeeded and refuses an input position seen twice. Every input row therefore
appears exactly once in OUT (an answer, or for a malformed row a line in OUT.bad.jsonl with
--skip-bad).

Shared storage. The index directory and the query file are read by the workers and OUT.parts
is written by them, so on a cluster of several machines all three must be on storage that every
node mounts at the same path (NFS, a cluster file system); the driver then reads OUT.parts and
writes OUT. On one machine any local path works.

Not resumable. Ray retries failed workers within a run, but a run whose driver dies starts
over (a rerun removes the Ray parts it finds); the local command is the resumable one.
Malformed rows: with skip_bad they are recorded (OUT.bad.jsonl, as the local command); without
it the parse step fails the run on the first one with DataFormatError quoting the row (no
output is written).

Resources. Reading, numbering, parsing and committing reserve no CPU; Ray Data starts the
pool before them, and its file listing for Parquet still takes a whole CPU, so the pool must
leave one CPU of the cluster free (checked). Threads per replica are set apart from its Ray
CPUs (`threads_per_worker`): Ray's CPU count is a reservation, torch's threads are real.
"""

from __future__ import annotations

import heapq
import json
import os
import re
import shutil
import time
import uuid
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import ray
from ray.data import Datasink
from ray.data.block import BlockAccessor
from ray.data.expressions import monotonically_increasing_id

from hippo_gpu.batch import BatchReport, QueryRow, answer_rows, check_row, write_answers
from hippo_gpu.config import MODES
from hippo_gpu.data import DataFormatError

__all__ = ["IndexActor", "retrieve_ray"]

RUN_FILE = "ray-run.json"  # marks OUT.parts as a Ray run's (the local command writes run.json)

# Rows between the stages, one per input line/row. status: "ok", "bad" (malformed; `error`
# says why), "blank" (an empty JSONL line: no row, but it counts for line numbers). `id` is the
# input id as JSON text, so 1 and "1" stay apart as in the local command's JSONL output.
ROW_SCHEMA = pa.schema([
    ("_order", pa.int64()),
    ("status", pa.string()),
    ("id", pa.string()),
    ("query", pa.string()),
    ("entities", pa.list_(pa.string())),
    ("error", pa.string()),
])
OUT_SCHEMA = pa.schema([
    ("_order", pa.int64()),
    ("status", pa.string()),
    ("id", pa.string()),
    ("keys", pa.list_(pa.string())),
    ("titles", pa.list_(pa.string())),
    ("scores", pa.list_(pa.float64())),
    ("error", pa.string()),
])


@dataclass(frozen=True)
class _Parse:
    """A block of input -> checked rows (ROW_SCHEMA) in slices of at most `rows` rows, each
    its own block: one large input block is spread over the whole pool. Malformed rows fail
    the run here, before any replica works on them, unless `skip_bad`."""

    kind: str  # "jsonl" (column `text`, one line per row) or "parquet" (id, query, entities?)
    source: str
    skip_bad: bool
    rows: int

    def __call__(self, block: pa.Table) -> Iterator[pa.Table]:
        orders = block.column("_order").to_pylist()
        if self.kind == "jsonl":
            raws: list[Any] = block.column("text").to_pylist()
        else:
            raws = block.drop_columns(["_order"]).to_pylist()
        cols: dict[str, list[Any]] = {k: [] for k in ROW_SCHEMA.names}
        for order, raw in zip(orders, raws):
            status, rid, query, ents, problem = self._check(raw)
            if problem is not None and not self.skip_bad:
                text = raw if isinstance(raw, str) else json.dumps(raw, default=str)
                raise DataFormatError(f"{self.source}: malformed row {text[:120]!r}: {problem} "
                                      "(--skip-bad records such rows and goes on)")
            for k, v in zip(ROW_SCHEMA.names, (order, status, rid, query, ents, problem)):
                cols[k].append(v)
        table = pa.Table.from_pydict(cols, schema=ROW_SCHEMA)
        for lo in range(0, table.num_rows, self.rows):
            yield table.slice(lo, self.rows)

    def _check(self, raw: Any) -> tuple[str, str | None, str | None, list[str] | None,
                                        str | None]:
        """(status, id as JSON, query, entities, problem)."""
        if self.kind == "jsonl":
            if not raw.strip():
                return "blank", None, None, None, None
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError as e:
                return "bad", None, None, None, f"not JSON ({e.msg})"
        try:
            rid, query, ents = check_row(raw)
        except DataFormatError as e:
            return "bad", None, None, None, str(e)
        return "ok", json.dumps(rid), query, list(ents) if ents is not None else None, None


class IndexActor:
    """One replica: loads the index once (in __init__), then answers batches of checked rows
    (ROW_SCHEMA) with the local command's code; rows that are not "ok" pass through.

    Args:
        index: index directory (readable on this worker's node).
        threads: torch threads of this replica.
        device, precision: forwarded to load_index.
        mode, top_k, batch_size: as Searcher.rank / the local command.
    """

    def __init__(self, index: str, *, threads: int, device: str, precision: str, mode: str,
                 top_k: int, batch_size: int) -> None:
        from hippo_gpu.device import set_threads
        from hippo_gpu.index import load_index
        from hippo_gpu.search import Searcher

        set_threads(threads)
        t0 = time.perf_counter()
        self.searcher = Searcher(load_index(index, device=device, precision=precision))
        # The query encoder loads on first use: load it now, so a replica is ready (and holds
        # its full memory) before Ray sends it work.
        self.searcher.rank(["warm-up"], top_k=1, mode="dense")
        self.load_seconds = time.perf_counter() - t0
        self.mode, self.top_k, self.batch_size = mode, top_k, batch_size

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = batch.to_pylist()
        todo = [QueryRow(r["_order"], r["id"], r["query"],
                         tuple(r["entities"]) if r["entities"] is not None else None)
                for r in rows if r["status"] == "ok"]
        answers = iter(answer_rows(self.searcher, todo, mode=self.mode, top_k=self.top_k,
                                   batch_size=self.batch_size))
        cols: dict[str, list[Any]] = {k: [] for k in ("keys", "titles", "scores")}
        for r in rows:
            a = next(answers) if r["status"] == "ok" else None
            for k in cols:
                cols[k].append(a[k] if a else None)
        return pa.Table.from_pydict({"_order": batch.column("_order"),
                                     "status": batch.column("status"),
                                     "id": batch.column("id"), **cols,
                                     "error": batch.column("error")}, schema=OUT_SCHEMA)


class _PartSink(Datasink[list[dict[str, Any]]]):
    """Commits each block as part-<first _order>.parquet (temporary name + rename); the driver
    gets the manifest of the committed parts in `on_write_complete`."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.manifest: list[dict[str, Any]] = []

    def write(self, blocks: Iterable[Any], ctx: Any) -> list[dict[str, Any]]:
        folder = Path(self.folder)
        done = []
        for block in blocks:
            table = BlockAccessor.for_block(block).to_arrow()
            if table.num_rows == 0:
                continue
            table = table.sort_by("_order")
            first = table.column("_order")[0].as_py()
            last = table.column("_order")[-1].as_py()
            name = f"part-{first:020d}.parquet"
            tmp = folder / f".{name}.tmp-{uuid.uuid4().hex}"
            pq.write_table(table, tmp)
            os.replace(tmp, folder / name)
            done.append({"file": name, "first": first, "last": last, "rows": table.num_rows})
        return done

    def on_write_complete(self, write_result: Any) -> None:
        self.manifest = [p for ret in write_result.write_returns for p in ret]

    def get_name(self) -> str:
        return "hippo_gpu_parts"


@dataclass
class _Join:
    """Walks the committed parts in input order; collects the malformed rows."""

    parts: Path
    manifest: list[dict[str, Any]]
    source: Path
    kind: str
    bad: list[dict[str, Any]]
    rows: int = 0

    def answers(self) -> Iterator[dict[str, Any]]:
        position = 0  # lines (JSONL, blank ones included) or rows (Parquet) seen so far
        last = -1
        for r in self._rows_in_order():
            if r["_order"] <= last:
                raise RuntimeError(f"Ray output holds input position {r['_order']} twice")
            last = r["_order"]
            position += 1
            if r["status"] == "blank":
                continue
            self.rows += 1
            if r["status"] == "bad":
                where = (f"{self.source}:{position}" if self.kind == "jsonl"
                         else f"{self.source} row {position - 1}")
                self.bad.append({"row": self.rows - 1, "where": where,
                                 "error": f"{where}: {r['error']}"})
                continue
            yield {"id": json.loads(r["id"]), "keys": r["keys"], "titles": r["titles"],
                   "scores": r["scores"]}

    def _rows_in_order(self) -> Iterator[dict[str, Any]]:
        """Rows of all parts by _order. Parts are sorted inside; parts whose ranges overlap
        (Ray may hand a write task blocks of several answer tasks) are merged, one group of
        overlapping parts in memory at a time."""
        parts = sorted({p["file"]: p for p in self.manifest}.values(),  # a name counts once
                       key=lambda p: p["first"])
        groups: list[list[dict[str, Any]]] = []
        end = -1
        for p in parts:
            if not groups or p["first"] > end:
                groups.append([])
            groups[-1].append(p)
            end = max(end, p["last"])
        for group in groups:
            yield from heapq.merge(*(self._read(p) for p in group), key=lambda r: r["_order"])

    def _read(self, part: dict[str, Any]) -> list[dict[str, Any]]:
        table = pq.read_table(self.parts / part["file"])
        if table.num_rows != part["rows"]:
            raise RuntimeError(f"{part['file']}: {table.num_rows} rows, the writer reported "
                               f"{part['rows']}")
        return table.to_pylist()


def _user_error(e: BaseException) -> DataFormatError | None:
    """The DataFormatError a worker raised, from the Ray error that reports it, else None.

    Ray Data hands a UDF's exception back as RayTaskError(UserCodeException) whose text holds
    the worker's traceback; the original exception object does not survive, so its last line
    ("hippo_gpu.data.DataFormatError: <message>") is read back from that text.
    """
    found = re.findall(r"hippo_gpu\.data\.DataFormatError: (.+)", str(e))
    return DataFormatError(found[-1].strip()) if found else None


def retrieve_ray(
    index: str | Path,
    queries: str | Path,
    out: str | Path,
    *,
    workers: int = 1,
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float = 0.0,
    threads_per_worker: int | None = None,
    mode: str = "hipporag2",
    top_k: int = 10,
    batch_size: int = 64,
    skip_bad: bool = False,
    device: str = "auto",
    precision: str = "float32",
    max_restarts: int = 3,
    max_task_retries: int = 3,
    actor_cls: type[IndexActor] = IndexActor,
) -> BatchReport:
    """Answer every row of `queries` into `out` on the connected Ray cluster (see the module
    docstring; `ray.init` first, or let Ray Data start a local instance).

    Args:
        index: index directory, on storage every worker reads.
        queries: JSON Lines or Parquet file of rows {"id", "query", "entities"?}.
        out: .jsonl or .parquet; OUT.parts (beside it) holds the parts while the run lasts.
        workers: actors in the pool, one index replica each.
        cpus_per_worker, gpus_per_worker: Ray resources of one actor (a GPU actor loads the
            index onto the GPU Ray gives it when device is "auto" or "cuda").
        threads_per_worker: torch threads per actor (default: cpus_per_worker, at least 1).
        max_restarts, max_task_retries: Ray's retries of a dead actor and of its batches.
        actor_cls: the replica class (a subclass can add instrumentation; tests inject faults).

    Returns:
        BatchReport (rows, answered, bad, parts, seconds including the actors' start).
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {MODES}")
    if min(top_k, batch_size, workers) < 1:
        raise ValueError("top_k, batch_size and workers must be >= 1")
    if cpus_per_worker < 0 or gpus_per_worker < 0:
        raise ValueError("cpus_per_worker and gpus_per_worker must be >= 0")
    index, queries, out = Path(index).resolve(), Path(queries).resolve(), Path(out).resolve()
    if not queries.is_file():
        raise FileNotFoundError(f"{queries}: no such query file")
    if not index.is_dir():
        raise FileNotFoundError(f"{index}: no such index directory")
    kind = "parquet" if queries.suffix == ".parquet" else "jsonl"
    threads = threads_per_worker or max(1, round(cpus_per_worker))
    cpus = ray.cluster_resources().get("CPU", 0.0) if ray.is_initialized() else None
    if cpus is not None and workers * cpus_per_worker > cpus - 1:
        # Ray Data starts the pool first; some of its read steps (listing Parquet files) ask
        # for a whole CPU, and would wait forever behind a pool that holds them all.
        raise ValueError(f"{workers} workers x {cpus_per_worker} CPUs leave less than one of "
                         f"the cluster's {cpus:g} CPUs for Ray Data's read and write tasks; "
                         "lower cpus_per_worker (threads_per_worker sets the torch threads)")
    parts = out.with_name(out.name + ".parts")
    if parts.exists():
        if not (parts / RUN_FILE).exists():
            raise DataFormatError(f"{parts} holds parts of a local run; finish it with the "
                                  "local command or remove it")
        shutil.rmtree(parts)  # an interrupted Ray run: not resumable, start over
    parts.mkdir(parents=True)
    (parts / RUN_FILE).write_text(json.dumps({"queries": str(queries), "index": str(index),
                                              "mode": mode, "top_k": top_k}))
    report = BatchReport()
    start = time.perf_counter()
    data = ray.data.DataContext.get_current()
    saved = data.execution_options.preserve_order
    data.execution_options.preserve_order = True  # keeps task ids, so _order, in input order
    try:
        # Reading, numbering, splitting and committing are light I/O: they reserve no CPU, so
        # a pool that takes every CPU of the cluster cannot starve its own input (deadlock).
        if kind == "jsonl":
            ds = ray.data.read_text(str(queries), drop_empty_lines=False, num_cpus=0)
        else:
            ds = ray.data.read_parquet(str(queries), num_cpus=0)
        ds = ds.with_column("_order", monotonically_increasing_id(), num_cpus=0)
        # Checked rows in blocks of batch_size (Ray's streaming repartition would reserve a
        # CPU: see above).
        ds = ds.map_batches(_Parse(kind, str(queries), skip_bad, batch_size), batch_size=None,
                            batch_format="pyarrow", num_cpus=0)
        with warnings.catch_warnings():
            # Ray 2.60 marks the catch-all remote args deprecated but names no other way to
            # bound an actor's restarts (its default is unbounded: a batch that kills every
            # actor would loop forever).
            warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
            ds = ds.map_batches(
                actor_cls,
                fn_constructor_kwargs=dict(index=str(index), threads=threads, device=device,
                                           precision=precision, mode=mode, top_k=top_k,
                                           batch_size=batch_size),
                batch_size=batch_size, batch_format="pyarrow",
                compute=ray.data.ActorPoolStrategy(size=workers),
                num_cpus=cpus_per_worker, num_gpus=gpus_per_worker or None,
                max_restarts=max_restarts, max_task_retries=max_task_retries)
        sink = _PartSink(str(parts))
        try:
            ds.write_datasink(sink, ray_remote_args={"num_cpus": 0})
        except Exception as e:  # a worker's error arrives wrapped by Ray: unwrap ours
            user = _user_error(e)
            if user is not None:
                raise user from e
            raise
    finally:
        data.execution_options.preserve_order = saved
    bad: list[dict[str, Any]] = []
    join = _Join(parts, sink.manifest, queries, kind, bad)
    write_answers(out, join.answers())
    report.rows, report.bad = join.rows, len(bad)
    report.answered = join.rows - len(bad)
    report.parts = len(sink.manifest)
    if bad:
        bad_file = out.with_name(out.name + ".bad.jsonl")
        tmp = bad_file.with_name(f".{bad_file.name}.tmp-{os.getpid()}")
        tmp.write_text("".join(json.dumps(b) + "\n" for b in bad), encoding="utf-8")
        os.replace(tmp, bad_file)
        report.bad_file = str(bad_file)
    shutil.rmtree(parts)
    report.seconds = time.perf_counter() - start
    return report
