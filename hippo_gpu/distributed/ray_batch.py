"""Batch retrieval of a query file on a Ray cluster (`hippo-gpu retrieve --ray`), resumable.

Same input and output as hippo_gpu.retrieval.batch (the local command): rows {"id", "query",
"entities"?} as JSON Lines or Parquet in; {"id", "keys", "titles", "scores"} per row, in input
order, out, JSON Lines or Parquet by OUT's suffix. The answers equal the local command's (same
keys in the same order; scores equal up to float rounding of a different batch composition).

Data flow:

    plan    the driver cuts the input into chunks (one committed part each) of about
            `part_size` rows without reading it through (`plan_parts`): JSON Lines by byte
            ranges that end at a line end (seek to the next multiple of the chunk's bytes, read
            on to the end of that line; chunk bytes = part_size x the mean line length of the
            file's first MiB), Parquet by slices of its row groups (from the footer). The plan
            is saved with the arguments in OUT.parts/ray-run.json.
    answer  Ray Data (`_answer_chunks`): from_items(chunks, one block each) ->
            map_batches(IndexActor, batch_size=1, ActorPoolStrategy(size=N)). Each actor
            opens the driver's SearcherSpec ONCE (the index loaded, the query encoder warmed
            up); per chunk it reads the chunk's rows from the query file, checks them with
            hippo_gpu.retrieval.batch.check_row (the local command's rule), answers them with
            hippo_gpu.retrieval.batch.answer_rows (the local command's code) in batches of
            batch_size, and commits OUT.parts/part-<chunk>.parquet (hippo_gpu.storage.parts:
            temporary name, fsync, rename). It returns one small manifest row per chunk, which
            the driver streams (progress, counts).
    join    the driver reads part 0, 1, 2, ... in order, checks that input positions only
            increase, and writes OUT with hippo_gpu.retrieval.batch.write_answers (atomic, the
            local format; `_join_parts`); then it removes OUT.parts.

Exactly once. OUT.parts follows the resumable-parts protocol of hippo_gpu.storage.parts (the local
command's): a part holds exactly the rows of its chunk and is named by the chunk, and a chunk's
rows are fixed by the saved plan, so no row can be in two parts and a part is complete or absent:
- a killed actor (killed, OOM, os._exit): Ray restarts it (up to `max_restarts`) and resubmits its
  chunks (`max_task_retries`); a chunk committed twice renames the same rows over the same name.
- a lost node (its raylet killed, the machine gone): its actors are restarted on the other nodes
  once the cluster declares the node dead, which takes Ray's health checks about 15 s by
  default; until then a call to such an actor fails at once as "temporarily unavailable" and is
  retried, so a bounded retry count would be spent within seconds and fail the run. Chunks are
  therefore retried without limit (`max_task_retries=-1`) while their actor can be restarted:
  `max_restarts` still bounds a chunk that kills every actor it reaches. The pool needs room
  on the remaining nodes for the restarted actors (workers x cpus_per_worker), else they wait
  for a node to join (tests/distributed/test_ray_multinode.py).
- a killed driver (or a lost cluster): the run stops; committed parts stay. Rerunning the same
  command finds ray-run.json with the same arguments and the same query file (size, mtime) and
  index version, removes the temporary files of unfinished parts and submits only the chunks
  that have no part. A rerun with other arguments is refused, naming what differs.
Every input row therefore appears exactly once in OUT (an answer, or for a malformed row a line
in OUT.bad.jsonl with `skip_bad`). Without `skip_bad` a malformed row fails the run with
DataFormatError naming the row (its byte offset in a JSON Lines file, its row number in a Parquet
file) and no output is written; the parts already committed stay for a rerun.

Shared storage. The index directory and the query file are read by the workers and OUT.parts is
written by them, so on a cluster of several machines all three must be on storage that every
node mounts at the same path (NFS, a cluster file system). On one machine any local path works.

Resources. Only the actors reserve CPUs (no read or write tasks), so the pool may take every CPU
of the cluster. Threads per replica are set apart from its Ray CPUs (the SearcherSpec's
`threads`): Ray's CPU count is a reservation, torch's threads are real.
"""

from __future__ import annotations

import functools
import json
import re
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import ray

from hippo_gpu.data import DataFormatError
from hippo_gpu.progress import progress
from hippo_gpu.retrieval.batch import BatchReport, QueryRow, answer_rows, check_row, write_answers
from hippo_gpu.retrieval.modes import mode_of
from hippo_gpu.retrieval.spec import SearcherSpec
from hippo_gpu.storage.durable import write_atomic
from hippo_gpu.storage.parts import RunParts

__all__ = ["IndexActor", "plan_parts", "retrieve_ray"]

RUN_FILE = "ray-run.json"  # marks OUT.parts as a Ray run's (the local command writes run.json)
PART = "part-{:08d}.parquet"  # the committed answers of one chunk
SAMPLE_BYTES = 1 << 20  # JSON Lines: the mean line length is measured on the first MiB
ROW_BITS = 32  # _order = chunk << ROW_BITS | row within the chunk

# Rows of a chunk, one per input line (JSON Lines, blank lines included so the join can number
# lines) or row (Parquet). status: "ok", "bad" (malformed; `error` says why), "blank" (an empty
# line). `id` is the input id as JSON text, so 1 and "1" stay apart as in the local command.
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


def plan_parts(queries: Path, part_size: int) -> list[list[int]]:
    """The chunks of `queries`, one per committed part, about `part_size` rows each, found
    without reading the file through: JSON Lines: [start byte, stop byte) ranges ending at a
    line end; Parquet: [row group, first row, stop row) slices of row groups. Deterministic for
    a given file. (Not retrieval.seeds.plan_chunks, which sizes a query batch's tensors.)"""
    if queries.suffix == ".parquet":
        meta = pq.ParquetFile(queries).metadata
        return [[g, lo, min(lo + part_size, meta.row_group(g).num_rows)]
                for g in range(meta.num_row_groups)
                for lo in range(0, meta.row_group(g).num_rows, part_size)]
    size = queries.stat().st_size
    with queries.open("rb") as f:
        sample = f.read(SAMPLE_BYTES)
        mean_line = len(sample) / max(1, sample.count(b"\n"))
        step = max(1, round(part_size * mean_line))
        bounds = [0]
        while bounds[-1] < size:
            f.seek(bounds[-1] + step - 1)
            f.readline()  # to the end of the line holding the step's last byte
            bounds.append(min(f.tell(), size))
    return [[lo, hi] for lo, hi in zip(bounds, bounds[1:])]


class IndexActor:
    """One replica: opens the searcher once (in __init__), then, per call, answers whole chunks
    of the query file and commits each as one part (see the module docstring).

    Args:
        spec: the searcher to open (index directory readable on this worker's node, absolute;
            threads of this replica; warm-up modes, at least "dense", so that the query
            encoder is loaded and the replica holds its full memory before Ray sends it work).
        index_version: the version the driver planned with (a different one raises).
        queries, kind: the query file and "jsonl" or "parquet".
        parts: OUT.parts, where committed parts go.
        skip_bad: record malformed rows in the part instead of failing the chunk.
        mode, top_k, batch_size: as Searcher.rank / the local command.
    """

    def __init__(self, spec: SearcherSpec, *, index_version: int | None, queries: str,
                 kind: str, parts: str, skip_bad: bool, mode: str, top_k: int,
                 batch_size: int) -> None:
        t0 = time.perf_counter()
        self.searcher = spec.open()
        if self.searcher.index.version != index_version:
            raise RuntimeError(f"{spec.index}: version {self.searcher.index.version} loaded, "
                               f"the run was planned on version {index_version} (a commit in "
                               "between)")
        self.load_seconds = time.perf_counter() - t0
        self.queries, self.kind = Path(queries), kind
        self.parts = RunParts(parts, run_file=RUN_FILE, part=PART)
        self.skip_bad = skip_bad
        self.mode, self.top_k, self.batch_size = mode, top_k, batch_size
        self._group: tuple[int, pa.Table] | None = None  # Parquet: the last row group read

    def __call__(self, chunks: pa.Table) -> pa.Table:
        """Chunk descriptors (chunk, span) -> one manifest row per committed part."""
        done: dict[str, list[int]] = {"chunk": [], "rows": [], "answered": [], "bad": []}
        for chunk, span in zip(chunks.column("chunk").to_pylist(),
                               chunks.column("span").to_pylist()):
            answers = self.answer(self.read(chunk, span))
            self.parts.commit(chunk, functools.partial(pq.write_table, answers))
            status = answers.column("status").to_pylist()
            done["chunk"].append(chunk)
            done["rows"].append(answers.num_rows - status.count("blank"))
            done["answered"].append(status.count("ok"))
            done["bad"].append(status.count("bad") + status.count("failed"))
        return pa.Table.from_pydict(done)

    def read(self, chunk: int, span: list[int]) -> pa.Table:
        """The checked rows (ROW_SCHEMA) of one chunk. A malformed row raises DataFormatError
        naming it, unless skip_bad (then it becomes a "bad" row)."""
        cols: dict[str, list[Any]] = {k: [] for k in ROW_SCHEMA.names}
        for j, (where, raw) in enumerate(self._raw_rows(span)):
            status, rid, query, ents, problem = _check(raw)
            if problem is not None and not self.skip_bad:
                text = raw if isinstance(raw, str) else json.dumps(raw, default=str)
                raise DataFormatError(f"{where}: malformed row {text[:120]!r}: {problem} "
                                      "(--skip-bad records such rows and goes on)")
            for k, v in zip(ROW_SCHEMA.names,
                            (chunk << ROW_BITS | j, status, rid, query, ents, problem)):
                cols[k].append(v)
        return pa.Table.from_pydict(cols, schema=ROW_SCHEMA)

    def _raw_rows(self, span: list[int]) -> Iterator[tuple[str, Any]]:
        """(where, raw row) per line or row of the span: raw is a line's text, or a row's
        dict, or a DataFormatError for a line that is not UTF-8."""
        if self.kind == "jsonl":
            start, stop = span
            with self.queries.open("rb") as f:
                f.seek(start)
                data = f.read(stop - start)
            offset = start
            for line in data.split(b"\n")[:-1] if data.endswith(b"\n") else data.split(b"\n"):
                where = f"{self.queries}: line at byte {offset}"
                offset += len(line) + 1
                try:
                    yield where, line.decode("utf-8")
                except UnicodeDecodeError:
                    yield where, DataFormatError("not UTF-8")
            return
        group, lo, hi = span
        if self._group is None or self._group[0] != group:
            pf = pq.ParquetFile(self.queries)
            first = sum(pf.metadata.row_group(g).num_rows for g in range(group))
            cols = [c for c in ("id", "query", "entities") if c in pf.schema_arrow.names]
            self._group = (group, pf.read_row_group(group, columns=cols).append_column(
                "_row", pa.array(range(first, first + pf.metadata.row_group(group).num_rows),
                                 pa.int64())))
        for row in self._group[1].slice(lo, hi - lo).to_pylist():
            yield f"{self.queries} row {row.pop('_row')}", row

    def answer(self, rows: pa.Table) -> pa.Table:
        """Checked rows (ROW_SCHEMA) -> answers (OUT_SCHEMA); rows not "ok" pass through."""
        table = rows.to_pylist()
        todo = [QueryRow(r["_order"], r["id"], r["query"],
                         tuple(r["entities"]) if r["entities"] is not None else None)
                for r in table if r["status"] == "ok"]
        answers = iter(answer_rows(self.searcher, todo, mode=self.mode, top_k=self.top_k,
                                   batch_size=self.batch_size))
        cols: dict[str, list[Any]] = {k: [] for k in ("keys", "titles", "scores")}
        status, errors = rows.column("status").to_pylist(), rows.column("error").to_pylist()
        for j, r in enumerate(table):
            a = next(answers) if r["status"] == "ok" else None
            if a is not None and "error" in a:  # retrieval failed: to the side file
                status[j], errors[j], a = "failed", a["error"], None
            for k in cols:
                cols[k].append(a[k] if a else None)
        return pa.Table.from_pydict({"_order": rows.column("_order"), "status": status,
                                     "id": rows.column("id"), **cols, "error": errors},
                                    schema=OUT_SCHEMA)


def _check(raw: Any) -> tuple[str, str | None, str | None, list[str] | None, str | None]:
    """(status, id as JSON, query, entities, problem) of one raw line (str) or row (dict)."""
    if isinstance(raw, DataFormatError):
        return "bad", None, None, None, str(raw)
    if isinstance(raw, str):
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


@dataclass
class _Join:
    """Walks the committed parts in input order; collects the malformed rows."""

    parts: RunParts
    chunks: int
    source: Path
    kind: str
    resumed_chunks: frozenset[int]
    bad: list[dict[str, Any]]
    rows: int = 0
    resumed: int = 0  # answered rows found in parts committed before this run

    def answers(self) -> Iterator[dict[str, Any]]:
        position = 0  # lines (JSONL, blank ones included) or rows (Parquet) seen so far
        last = -1
        for chunk, path in enumerate(self.parts.in_order(self.chunks)):
            table = pq.read_table(path, schema=OUT_SCHEMA)
            for r in table.to_pylist():
                if r["_order"] <= last or r["_order"] >> ROW_BITS != chunk:
                    raise RuntimeError(f"{path}: input position {r['_order']} out of place")
                last = r["_order"]
                position += 1
                if r["status"] == "blank":
                    continue
                self.rows += 1
                if r["status"] in ("bad", "failed"):
                    where = (f"{self.source}:{position}" if self.kind == "jsonl"
                             else f"{self.source} row {position - 1}")
                    self.bad.append({"row": self.rows - 1, "where": where,
                                     "error": f"{where}: {r['error']}"})
                    continue
                self.resumed += chunk in self.resumed_chunks
                yield {"id": json.loads(r["id"]), "keys": r["keys"], "titles": r["titles"],
                       "scores": r["scores"]}


def _user_error(e: BaseException) -> DataFormatError | None:
    """The DataFormatError a worker raised, from the Ray error that reports it, else None.

    Ray Data hands a UDF's exception back as RayTaskError(UserCodeException) whose text holds
    the worker's traceback; the original exception object does not survive, so its last line
    ("hippo_gpu.data.DataFormatError: <message>") is read back from that text.
    """
    found = re.findall(r"hippo_gpu\.data\.DataFormatError: (.+)", str(e))
    return DataFormatError(found[-1].strip()) if found else None


def _run_identity(queries: Path, index: Path, kind: str, mode: str, top_k: int,
                  part_size: int) -> dict[str, Any]:
    from hippo_gpu.storage.directory import read_manifest

    st = queries.stat()
    return {"queries": str(queries), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "kind": kind, "index": str(index), "index_version": read_manifest(index).get("version"),
            "mode": mode, "top_k": top_k, "part_size": part_size}


def _open_run(parts: RunParts, identity: dict[str, Any], queries: Path) -> list[list[int]]:
    """The plan of this run: the saved one when OUT.parts holds the same run, else a new one
    (saved with the identity). Refuses parts of another run (hippo_gpu.storage.parts)."""
    saved = parts.resume(identity)
    if saved is None:
        saved = parts.start(identity, plan=plan_parts(queries, identity["part_size"]))
    return [list(c) for c in saved["plan"]]


def retrieve_ray(
    spec: SearcherSpec,
    queries: str | Path,
    out: str | Path,
    *,
    workers: int = 1,
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float = 0.0,
    mode: str = "hipporag2",
    top_k: int = 10,
    batch_size: int = 64,
    part_size: int = 4096,
    skip_bad: bool = False,
    max_restarts: int = 3,
    max_task_retries: int = -1,
    show_progress: bool = False,
    actor_cls: type[IndexActor] = IndexActor,
) -> BatchReport:
    """Answer every row of `queries` into `out` on the connected Ray cluster; rerun the same
    call after a crash to finish it (see the module docstring; `ray.init` first, or let Ray
    Data start a local instance).

    Args:
        spec: what every actor opens: its index directory on storage every worker reads (made
            absolute here), device and precisions; its threads are the torch threads per
            actor (None: cpus_per_worker rounded, at least 1); with no warm-up modes the
            actors warm up "dense".
        queries: JSON Lines or Parquet file of rows {"id", "query", "entities"?}.
        out: .jsonl or .parquet; OUT.parts (beside it) holds the parts until the join.
        workers: actors in the pool, one index replica each.
        cpus_per_worker, gpus_per_worker: Ray resources of one actor (a GPU actor loads the
            index onto the GPU Ray gives it when the spec's device is "auto" or "cuda").
        part_size: rows per chunk, the unit of work and of commit (about, for JSON Lines).
        max_restarts, max_task_retries: Ray's restarts of a dead actor, and retries of a
            chunk whose actor failed (-1: while the actor can be restarted; see "a lost node"
            in the module docstring for why a bound fails a run that loses a node).
        show_progress: a progress bar of answered queries on the driver.
        actor_cls: the replica class (a subclass can add instrumentation; tests inject faults).

    Returns:
        BatchReport: rows, answered (in this run), resumed (from parts committed before), bad,
        parts, seconds (including the actors' start).
    """
    _check_arguments(mode=mode, top_k=top_k, batch_size=batch_size, workers=workers,
                     part_size=part_size, cpus_per_worker=cpus_per_worker,
                     gpus_per_worker=gpus_per_worker)
    index, queries, out = spec.index.resolve(), Path(queries).resolve(), Path(out).resolve()
    if not queries.is_file():
        raise FileNotFoundError(f"{queries}: no such query file")
    if not index.is_dir():
        raise FileNotFoundError(f"{index}: no such index directory")
    kind = "parquet" if queries.suffix == ".parquet" else "jsonl"
    spec = replace(spec, index=index, threads=spec.threads or max(1, round(cpus_per_worker)),
                   warm_up=spec.warm_up_modes or ("dense",))
    _check_cluster(workers, cpus_per_worker)
    parts = RunParts.beside(out, run_file=RUN_FILE, part=PART)
    identity = _run_identity(queries, index, kind, mode, top_k, part_size)
    plan = _open_run(parts, identity, queries)
    committed = parts.committed()
    todo = [{"chunk": i, "span": span} for i, span in enumerate(plan) if i not in committed]
    start = time.perf_counter()
    if todo:
        actor_kwargs = dict(index_version=identity["index_version"], queries=str(queries),
                            kind=kind, parts=str(parts.dir), skip_bad=skip_bad, mode=mode,
                            top_k=top_k, batch_size=batch_size)
        _answer_chunks(todo, actor_cls, spec, actor_kwargs, workers=workers,
                       cpus_per_worker=cpus_per_worker, gpus_per_worker=gpus_per_worker,
                       max_restarts=max_restarts, max_task_retries=max_task_retries,
                       show_progress=show_progress)
    report = _join_parts(parts, len(plan), committed, queries, kind, out)
    parts.remove()
    report.seconds = time.perf_counter() - start
    return report


def _check_arguments(*, mode: str, top_k: int, batch_size: int, workers: int, part_size: int,
                     cpus_per_worker: float, gpus_per_worker: float) -> None:
    mode_of(mode)  # ValueError naming the modes
    if min(top_k, batch_size, workers, part_size) < 1:
        raise ValueError("top_k, batch_size, workers and part_size must be >= 1")
    if part_size >= 1 << ROW_BITS:
        raise ValueError(f"part_size must be < 2**{ROW_BITS}")
    if cpus_per_worker < 0 or gpus_per_worker < 0:
        raise ValueError("cpus_per_worker and gpus_per_worker must be >= 0")


def _check_cluster(workers: int, cpus_per_worker: float) -> None:
    """Refuse a pool the connected cluster cannot hold (its actors would wait forever)."""
    cpus = ray.cluster_resources().get("CPU", 0.0) if ray.is_initialized() else None
    if cpus is not None and workers * cpus_per_worker > cpus:
        raise ValueError(f"{workers} workers x {cpus_per_worker} CPUs exceed the cluster's "
                         f"{cpus:g} CPUs; lower cpus_per_worker (the spec's threads set the "
                         "torch threads)")


def _answer_chunks(todo: list[dict[str, Any]], actor_cls: type[IndexActor], spec: SearcherSpec,
                   actor_kwargs: dict[str, Any], *, workers: int, cpus_per_worker: float,
                   gpus_per_worker: float, max_restarts: int, max_task_retries: int,
                   show_progress: bool) -> None:
    """The chunks `todo` answered and committed by a pool of `workers` actors
    (actor_cls(spec, **actor_kwargs)); a worker's DataFormatError is raised here, unwrapped."""
    start = time.perf_counter()
    bar = progress(total=None, desc="retrieve --ray", unit="q", disable=not show_progress)
    # A chunk per block, so chunks spread over the pool one by one.
    ds: ray.data.Dataset = ray.data.from_items(todo, override_num_blocks=len(todo))
    with warnings.catch_warnings():
        # Ray 2.60 marks the catch-all remote args deprecated but names no other way to
        # bound an actor's restarts (its default is unbounded: a chunk that kills every
        # actor would loop forever).
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
        ds = ds.map_batches(
            actor_cls, fn_constructor_args=(spec,), fn_constructor_kwargs=actor_kwargs,
            batch_size=1, batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=workers),
            num_cpus=cpus_per_worker, num_gpus=gpus_per_worker or None,
            max_restarts=max_restarts, max_task_retries=max_task_retries)
    try:
        for done in ds.iter_rows():
            bar.update(done["answered"])
            bar.set_postfix(q_per_s=f"{bar.n / max(time.perf_counter() - start, 1e-9):.1f}")
    except Exception as e:  # a worker's error arrives wrapped by Ray: unwrap ours
        user = _user_error(e)
        if user is not None:
            raise user from e
        raise
    finally:
        bar.close()


def _join_parts(parts: RunParts, chunks: int, committed: frozenset[int], queries: Path,
                kind: str, out: Path) -> BatchReport:
    """OUT written from the committed parts in input order, the malformed rows beside it in
    OUT.bad.jsonl; the counts (without seconds)."""
    bad: list[dict[str, Any]] = []
    join = _Join(parts, chunks, queries, kind, committed, bad)
    write_answers(out, join.answers())
    report = BatchReport(rows=join.rows, bad=len(bad), resumed=join.resumed, parts=chunks)
    report.answered = join.rows - len(bad) - join.resumed
    if bad:
        bad_file = out.with_name(out.name + ".bad.jsonl")
        write_atomic(bad_file, "".join(json.dumps(b) + "\n" for b in bad))
        report.bad_file = str(bad_file)
    return report
