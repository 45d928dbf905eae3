"""Batch retrieval of a query file: stream rows in, answer them in batches, write committed parts.

Input rows: {"id": str|int, "query": str, "entities": [str, ...] (optional)}, as JSON Lines or
Parquet. Output rows, in input order: {"id", "keys", "titles", "scores"}, as JSON Lines or
Parquet (chosen by the file suffix; Parquet needs pyarrow, the `[parquet]` extra).

Crash safety: the output is written as parts beside it (OUT.parts/part-NNNNNN.jsonl, each one
written to a temporary file and renamed, so a part is either complete or absent), one per
`part_size` input rows. A rerun with the same arguments skips the rows its committed parts hold
and continues; when every part exists they are joined into OUT (atomically) and the parts
removed. So a run killed at any point and rerun gives every id exactly once, in input order.
A `run.json` in the parts folder records the arguments; parts of a different run are never
mixed in (the rerun refuses, naming the difference).

Memory does not grow with the input: rows are read lazily, one part at a time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hippo_gpu.config import MODES
from hippo_gpu.data import DataFormatError
from hippo_gpu.progress import progress
from hippo_gpu.search import Searcher

__all__ = ["BatchReport", "QueryRow", "answer_rows", "check_row", "read_query_rows",
           "retrieve_file", "write_answers"]


@dataclass(frozen=True)
class QueryRow:
    index: int  # 0-based position in the input
    id: str | int
    query: str
    entities: tuple[str, ...] | None = None


@dataclass
class BatchReport:
    rows: int = 0
    answered: int = 0
    resumed: int = 0  # rows found already answered in committed parts
    bad: int = 0  # malformed rows recorded in the side file (skip_bad)
    failed: int = 0  # rows whose retrieval failed (uncertified PPR), in the side file too
    seconds: float = 0.0
    parts: int = 0
    bad_file: str | None = None
    stage_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def queries_per_s(self) -> float:
        return self.answered / self.seconds if self.seconds > 0 else 0.0


def check_row(raw: Any) -> tuple[str | int, str, tuple[str, ...] | None]:
    """(id, query, entities) of one decoded input row; DataFormatError (without a location)
    says what is wrong. Shared with hippo_gpu.distributed, whose workers check their rows."""
    if not isinstance(raw, dict):
        raise DataFormatError("a row is an object with 'id' and 'query'")
    rid, query, ents = raw.get("id"), raw.get("query"), raw.get("entities")
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise DataFormatError(f"'id' must be a string or an integer, got {rid!r}")
    if not isinstance(query, str) or not query.strip():
        raise DataFormatError("'query' must be a non-empty string")
    if ents is not None and (not isinstance(ents, list)
                             or not all(isinstance(e, str) for e in ents)):
        raise DataFormatError("'entities' must be a list of strings")
    return rid, query, tuple(ents) if ents is not None else None


def _check_row(raw: Any, where: str) -> tuple[str | int, str, tuple[str, ...] | None]:
    try:
        return check_row(raw)
    except DataFormatError as e:
        raise DataFormatError(f"{where}: {e}") from None


def read_query_rows(path: str | Path, *, skip_bad: bool = False,
                    bad: list[dict[str, Any]] | None = None) -> Iterator[QueryRow | None]:
    """Yield each input row checked (None for a malformed row when `skip_bad`; it is appended
    to `bad` with its reason). Raises DataFormatError naming the row otherwise."""
    path = Path(path)
    if path.suffix == ".parquet":
        raw_rows: Iterator[tuple[str, Any]] = _parquet_rows(path)
    else:
        raw_rows = _jsonl_rows(path)
    for i, (where, raw) in enumerate(raw_rows):
        try:
            if isinstance(raw, Exception):
                raise raw
            rid, query, ents = _check_row(raw, where)
        except DataFormatError as e:
            if not skip_bad:
                raise
            if bad is not None:
                bad.append({"row": i, "where": where, "error": str(e)})
            yield None
            continue
        yield QueryRow(i, rid, query, ents)


def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{n}", json.loads(line)
            except json.JSONDecodeError as e:
                yield f"{path}:{n}", DataFormatError(f"{path}:{n}: not JSON ({e.msg})")


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    pq = _pyarrow_parquet()
    n = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            yield f"{path} row {n}", row
            n += 1


def _pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError("Parquet input/output needs pyarrow: pip install "
                          "'hippo-gpu[parquet]'") from e
    return pq


def _run_identity(queries: Path, searcher: Searcher, mode: str, top_k: int,
                  part_size: int) -> dict[str, Any]:
    st = queries.stat()
    index = searcher.index
    return {"queries": str(queries.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "mode": mode, "top_k": top_k, "part_size": part_size,
            "index": str(index.path) if index.path else None, "index_version": index.version,
            "passages": len(index.passage_keys),
            "index_digest": hashlib.sha256("\n".join(index.passage_keys).encode()).hexdigest()}


def retrieve_file(
    searcher: Searcher,
    queries: str | Path,
    out: str | Path,
    *,
    mode: str = "hipporag2",
    top_k: int = 10,
    batch_size: int = 64,
    part_size: int = 4096,
    skip_bad: bool = False,
    show_progress: bool = True,
) -> BatchReport:
    """Answer every row of `queries` into `out` (see the module docstring)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {MODES}")
    if top_k < 1 or batch_size < 1 or part_size < 1:
        raise ValueError("top_k, batch_size and part_size must be >= 1")
    queries, out = Path(queries), Path(out)
    if not queries.is_file():
        raise FileNotFoundError(f"{queries}: no such query file")
    fmt = "parquet" if out.suffix == ".parquet" else "jsonl"
    if fmt == "parquet":
        _pyarrow_parquet()
    parts = out.with_name(out.name + ".parts")
    identity = _run_identity(queries, searcher, mode, top_k, part_size)
    parts.mkdir(parents=True, exist_ok=True)
    run_file = parts / "run.json"
    if run_file.exists():
        before = json.loads(run_file.read_text())
        diff = sorted(k for k in identity if before.get(k) != identity[k])
        if diff:
            raise DataFormatError(
                f"{parts} holds parts of another run (differs in {', '.join(diff)}); remove "
                "it to start over")
    else:
        _write_atomic(run_file, json.dumps(identity, indent=1))
    report = BatchReport()
    bad: list[dict[str, Any]] = []
    start = time.perf_counter()
    bar = progress(total=None, desc="retrieve", unit="q", disable=not show_progress)
    rows = read_query_rows(queries, skip_bad=skip_bad, bad=bad)
    part_no = 0
    while True:
        chunk = [r for _, r in zip(range(part_size), rows)]
        if not chunk:
            break
        report.rows += len(chunk)
        path = parts / f"part-{part_no:06d}.jsonl"
        good = [r for r in chunk if r is not None]
        failed_file = path.with_suffix(".failed.jsonl")
        if path.exists():
            report.resumed += len(good) - len(_read_lines(failed_file))
        else:
            lines, failed = _answer(searcher, good, mode, top_k, batch_size, report)
            if failed:  # committed before its part, so a resumed run finds both
                _write_atomic(failed_file, "".join(failed))
            _write_atomic(path, "".join(lines))
            report.answered += len(lines)
            bar.update(len(good))
            elapsed = time.perf_counter() - start
            bar.set_postfix(q_per_s=f"{report.answered / max(elapsed, 1e-9):.1f}")
        part_no += 1
    bar.close()
    report.parts = part_no
    report.bad = len(bad)
    failed = [line for i in range(part_no)
              for line in _read_lines(parts / f"part-{i:06d}.failed.jsonl")]
    report.failed = len(failed)
    if bad or failed:
        bad_file = out.with_name(out.name + ".bad.jsonl")
        _write_atomic(bad_file, "".join([json.dumps(b) + "\n" for b in bad] + failed))
        report.bad_file = str(bad_file)
    _join_parts(parts, part_no, out, fmt)
    shutil.rmtree(parts)
    report.seconds = time.perf_counter() - start
    return report


def answer_rows(searcher: Searcher, rows: Sequence[QueryRow], *, mode: str, top_k: int,
                batch_size: int, stage_seconds: dict[str, float] | None = None
                ) -> list[dict[str, Any]]:
    """The answers {"id", "keys", "titles", "scores"} to `rows`, in order. Rows with and
    without entities are batched apart (a query without entities uses the searcher's default
    for the mode). Stage times are added into `stage_seconds` when given. A row whose retrieval
    failed (hippo_gpu.search.Ranking.failed) has empty lists and an "error" saying why."""
    out: dict[int, dict[str, Any]] = {}
    with_ents = [r for r in rows if r.entities is not None]
    without = [r for r in rows if r.entities is None]
    for group, has in ((without, False), (with_ents, True)):
        for i in range(0, len(group), batch_size):
            batch = group[i:i + batch_size]
            ents = [list(r.entities or ()) for r in batch] if has else None
            ranking = searcher.rank([r.query for r in batch], top_k=top_k, mode=mode,
                                    query_entities=ents)
            if stage_seconds is not None:
                for k, v in ranking.stage_seconds.items():
                    stage_seconds[k] = stage_seconds.get(k, 0.0) + v
            for j, (r, hits) in enumerate(zip(batch, searcher.to_hits(ranking))):
                out[r.index] = {"id": r.id, "keys": [h.key for h in hits],
                                "titles": [h.title for h in hits],
                                "scores": [h.score for h in hits]}
                if j in ranking.failed:
                    out[r.index]["error"] = ranking.failed[j]
    return [out[r.index] for r in rows]


def _answer(searcher: Searcher, rows: Sequence[QueryRow], mode: str, top_k: int,
            batch_size: int, report: BatchReport) -> tuple[list[str], list[str]]:
    """(JSON lines of the answers to `rows`, in order; JSON lines of the rows whose retrieval
    failed, {"row", "id", "error"}: they go to the side file, not the output)."""
    answers = answer_rows(searcher, rows, mode=mode, top_k=top_k, batch_size=batch_size,
                          stage_seconds=report.stage_seconds)
    good = [json.dumps(a, ensure_ascii=False) + "\n" for a in answers if "error" not in a]
    failed = [json.dumps({"row": r.index, "id": r.id, "error": a["error"]},
                         ensure_ascii=False) + "\n"
              for r, a in zip(rows, answers) if "error" in a]
    return good, failed


def _read_lines(path: Path) -> list[str]:
    """The lines of `path` ([] when it does not exist)."""
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as f:
        return f.readlines()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _join_parts(parts: Path, n: int, out: Path, fmt: str) -> None:
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    if fmt == "jsonl":
        with tmp.open("w", encoding="utf-8") as f:
            for i in range(n):
                with (parts / f"part-{i:06d}.jsonl").open(encoding="utf-8") as g:
                    shutil.copyfileobj(g, f)
            f.flush()
            os.fsync(f.fileno())
    else:
        def chunks() -> Iterator[list[dict[str, Any]]]:
            for i in range(n):
                with (parts / f"part-{i:06d}.jsonl").open(encoding="utf-8") as g:
                    yield [json.loads(line) for line in g]

        _write_parquet_answers(tmp, chunks())
    os.replace(tmp, out)


def _write_parquet_answers(path: Path, chunks: Iterable[list[dict[str, Any]]]) -> None:
    import pyarrow as pa

    pq = _pyarrow_parquet()
    schema = pa.schema([("id", pa.string()), ("keys", pa.list_(pa.string())),
                        ("titles", pa.list_(pa.string())), ("scores", pa.list_(pa.float64()))])
    with pq.ParquetWriter(path, schema) as writer:
        for rows in chunks:
            rows = [{**r, "id": str(r["id"])} for r in rows]
            if rows:
                writer.write_table(pa.Table.from_pylist(rows, schema=schema))


def write_answers(out: str | Path, answers: Iterable[dict[str, Any]],
                  chunk_rows: int = 4096) -> None:
    """Write answer dicts (answer_rows' form) to `out` atomically, in the format the local
    command writes for that suffix (JSON Lines, or Parquet with string ids)."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    if out.suffix == ".parquet":
        def chunks() -> Iterator[list[dict[str, Any]]]:
            it = iter(answers)
            while chunk := [a for _, a in zip(range(chunk_rows), it)]:
                yield chunk

        _write_parquet_answers(tmp, chunks())
    else:
        with tmp.open("w", encoding="utf-8") as f:
            for a in answers:
                f.write(json.dumps(a, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, out)
