"""Batch retrieval of a query file: stream rows in, answer them in batches, write committed parts.

Input rows: {"id": str|int, "query": str, "entities": [str, ...] (optional)}, as JSON Lines or
Parquet. Output rows, in input order: {"id", "keys", "titles", "scores"}, as JSON Lines or
Parquet (chosen by the file suffix; Parquet needs pyarrow, the `[parquet]` extra); on an index
whose corpus gave passages ids or metadata, also "passage_ids" and "passage_metadata" (aligned
with "keys", null where a passage has none; in Parquet the metadata is JSON text).

With `explain`, each row also holds its hits' decomposition (`Searcher.explain`, columns
EXPLAIN_COLUMNS): "seeds" [{phrase, weight, share}] of the query, and per hit (aligned with
"keys") "contributions" (one term per seed, in "seeds" order), "dense" (the dense prior's
term; null for hipporag1), "offset" (hipporag1's min-max shift), "value" (what the terms sum
to: the score, or hybrid's PPR value), "bound" (|Σ terms − value| ≤ bound) and "fused_ranks"
(hybrid: {ppr, dense, entity} 0-based ranks, entity -1 without an entity ranking; else null).

Crash safety: the output is written as parts beside it (OUT.parts/part-NNNNNN.jsonl), one per
`part_size` input rows, under the resumable-parts protocol of hippo_gpu.storage.parts (shared with
the Ray job): each part is committed atomically, so it is complete or absent; a `run.json` records
the arguments, and a rerun with the same arguments skips the rows its committed parts hold and
continues, while one with other arguments is refused, naming the difference; when every part exists
they are joined into OUT (atomically) and the parts removed. So a run killed at any point and rerun
gives every id exactly once, in input order. Rows whose retrieval failed go to
part-NNNNNN.failed.jsonl, committed before their part, and from there to OUT.bad.jsonl.

Memory does not grow with the input: rows are read lazily, one part at a time. A new run reads
them once more before it creates OUT.parts, so a malformed row (without `skip_bad`) or an
unreadable file is refused with nothing written, and the rerun on the fixed file starts clean.

IRCoT (`ircot=IRCoTOptions(...)`, hippo_gpu.retrieval.ircot): each batch of rows runs the batched
IRCoT loop instead of one retrieval, and each output row also holds "thoughts" (in order), "steps"
and "stop" (why its loop ended; with "stop_error" when a thought or its retrieval failed, the row is
still answered with what it had). The options' identity (steps, model, prompt) is part of the run
identity; with a cached thought source a resumed run gets the same thoughts again for the rows of
the part it redoes, and none for the committed parts.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hippo_gpu.data import DataFormatError
from hippo_gpu.errors import BLANK
from hippo_gpu.progress import progress
from hippo_gpu.retrieval.explanation import QueryExplanation
from hippo_gpu.retrieval.ircot import IRCoTOptions, IRCoTResult, ircot_retrieve
from hippo_gpu.retrieval.modes import Mode, mode_of
from hippo_gpu.retrieval.results import QueryFailure
from hippo_gpu.retrieval.searcher import Searcher
from hippo_gpu.storage.durable import write_atomic
from hippo_gpu.storage.parts import RunParts

__all__ = ["EXPLAIN_COLUMNS", "BatchReport", "QueryRow", "answer_rows", "check_row",
           "explain_columns", "read_query_rows", "retrieve_file", "write_answers"]

RUN_FILE = "run.json"  # the run's identity, in OUT.parts (hippo_gpu.storage.parts)
PART = "part-{:06d}.jsonl"  # the committed answers of part_size input rows
EXPLAIN_COLUMNS = ("seeds", "contributions", "dense", "offset", "value", "bound", "fused_ranks")


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
        raise DataFormatError("'id' must be a string or an integer, got "
                              + ("nothing" if rid is None else type(rid).__name__))
    if not isinstance(query, str):
        raise DataFormatError("'query' must be a string")
    if not query.strip():
        raise DataFormatError(f"'query' {BLANK}")
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
    """(where, the decoded row, or the DataFormatError of a line that is not UTF-8 JSON)."""
    try:
        with path.open("rb") as f:
            for n, raw in enumerate(f, start=1):
                where = f"{path}:{n}"
                try:
                    line = raw.decode("utf-8")
                    if line.strip():
                        yield where, json.loads(line)
                except UnicodeDecodeError as e:
                    yield where, DataFormatError(f"{where}: not UTF-8 text ({e.reason})")
                except json.JSONDecodeError as e:
                    yield where, DataFormatError(f"{where}: not JSON ({e.msg})")
                except (ValueError, RecursionError) as e:  # 4301+ digits; nested too deep
                    yield where, DataFormatError(f"{where}: not readable JSON "
                                                 f"({type(e).__name__})")
    except OSError as e:
        raise DataFormatError(f"{path}: cannot read it ({e.strerror or type(e).__name__})") \
            from None


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    pq = _pyarrow_parquet()
    import pyarrow as pa

    n = 0
    try:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
            for row in batch.to_pylist():
                yield f"{path} row {n}", row
                n += 1
    except (pa.ArrowException, OSError) as e:  # not Parquet, or cut short
        raise DataFormatError(f"{path} row {n}: not a readable Parquet file "
                              f"({type(e).__name__})") from None


def _pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError("Parquet input/output needs pyarrow: pip install "
                          "'hippo-gpu[parquet]'") from e
    return pq


def _check_rows(queries: Path, skip_bad: bool) -> None:
    """Read every row of `queries` once and raise its first DataFormatError (a malformed row
    unless `skip_bad`; an unreadable file always), before the run creates OUT.parts: a refused
    run leaves no parts, whose identity (the file's size and mtime) would refuse the rerun once
    the file is fixed. One more pass over the input, lazily as the run's own: it costs the
    parsing only, small beside the retrieval."""
    for _ in read_query_rows(queries, skip_bad=skip_bad):
        pass


def _run_identity(queries: Path, searcher: Searcher, mode: str, top_k: int,
                  part_size: int, ircot: IRCoTOptions | None = None,
                  explain: bool = False) -> dict[str, Any]:
    st = queries.stat()
    index = searcher.index
    return {"queries": str(queries.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "mode": mode, "top_k": top_k, "part_size": part_size, "explain": explain,
            "ircot": None if ircot is None else ircot.identity(),
            "index": str(index.path) if index.path else None, "index_version": index.version,
            "passages": len(index.passage_keys),
            "index_digest": hashlib.sha256("\n".join(index.passage_keys).encode()).hexdigest()}


def retrieve_file(
    searcher: Searcher,
    queries: str | Path,
    out: str | Path,
    *,
    mode: str | Mode = "hipporag2",
    top_k: int = 10,
    batch_size: int = 64,
    part_size: int = 4096,
    skip_bad: bool = False,
    show_progress: bool = True,
    ircot: IRCoTOptions | None = None,
    explain: bool = False,
) -> BatchReport:
    """Answer every row of `queries` into `out` (see the module docstring; `ircot`: IRCoT
    rows; `explain` adds the decomposition columns)."""
    how = mode_of(mode)
    if top_k < 1 or batch_size < 1 or part_size < 1:
        raise ValueError("top_k, batch_size and part_size must be >= 1")
    queries, out = Path(queries), Path(out)
    if not queries.is_file():
        raise FileNotFoundError(f"{queries}: no such query file")
    fmt = "parquet" if out.suffix == ".parquet" else "jsonl"
    if fmt == "parquet":
        _pyarrow_parquet()
    parts = RunParts.beside(out, run_file=RUN_FILE, part=PART)
    identity = _run_identity(queries, searcher, how.name, top_k, part_size, ircot, explain)
    if parts.resume(identity) is None:  # a new run: every row checked before OUT.parts exists
        _check_rows(queries, skip_bad)
        parts.start(identity)
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
        good = [r for r in chunk if r is not None]
        failed_file = _failed_file(parts, part_no)
        if parts.path(part_no).exists():
            report.resumed += len(good) - len(_read_lines(failed_file))
        else:
            lines, failed = _answer(searcher, good, how, top_k, batch_size, report, ircot,
                                    explain)
            if failed:  # committed before its part, so a resumed run finds both
                write_atomic(failed_file, "".join(failed))
            parts.commit(part_no, "".join(lines))
            report.answered += len(lines)
            bar.update(len(good))
            elapsed = time.perf_counter() - start
            bar.set_postfix(q_per_s=f"{report.answered / max(elapsed, 1e-9):.1f}")
        part_no += 1
    bar.close()
    report.parts = part_no
    report.bad = len(bad)
    failed = [line for i in range(part_no) for line in _read_lines(_failed_file(parts, i))]
    report.failed = len(failed)
    if bad or failed:
        bad_file = out.with_name(out.name + ".bad.jsonl")
        write_atomic(bad_file, "".join([json.dumps(b) + "\n" for b in bad] + failed))
        report.bad_file = str(bad_file)
    _join_parts(parts.in_order(part_no), out, fmt, ircot is not None, explain)
    parts.remove()
    report.seconds = time.perf_counter() - start
    return report


def answer_rows(searcher: Searcher, rows: Sequence[QueryRow], *, mode: str | Mode, top_k: int,
                batch_size: int, stage_seconds: dict[str, float] | None = None,
                ircot: IRCoTOptions | None = None,
                explain: bool = False) -> list[dict[str, Any]]:
    """The answers {"id", "keys", "titles", "scores"} to `rows`, in order. Rows with and
    without entities are batched apart (a query without entities uses the searcher's default
    for the mode). Stage times are added into `stage_seconds` when given. A row whose retrieval
    failed (hippo_gpu.retrieval.results.Ranking.failed) has empty lists and an "error" saying why.
    With `ircot`, each batch runs the IRCoT loop (see the module docstring); with `explain`
    the answers also hold the EXPLAIN_COLUMNS (`Searcher.explain`)."""
    mode = mode_of(mode)
    out: dict[int, dict[str, Any]] = {}
    with_ents = [r for r in rows if r.entities is not None]
    without = [r for r in rows if r.entities is None]
    for group, has in ((without, False), (with_ents, True)):
        for i in range(0, len(group), batch_size):
            batch = group[i:i + batch_size]
            ents = [list(r.entities or ()) for r in batch] if has else None
            if ircot is not None:
                out.update(_answer_ircot(searcher, batch, ents, mode, top_k, ircot,
                                         stage_seconds))
                continue
            texts = [r.query for r in batch]
            if explain:
                for r, answer in zip(batch, _explained(searcher, texts, top_k, mode, ents)):
                    out[r.index] = {"id": r.id, **answer}
                continue
            ranking = searcher.rank(texts, top_k=top_k, mode=mode, query_entities=ents)
            if stage_seconds is not None:
                for k, v in ranking.stage_seconds.items():
                    stage_seconds[k] = stage_seconds.get(k, 0.0) + v
            labelled = bool(searcher.index.labels)
            for j, (r, hits) in enumerate(zip(batch, searcher.to_hits(ranking))):
                out[r.index] = {"id": r.id, "keys": [h.key for h in hits],
                                "titles": [h.title for h in hits],
                                "scores": [h.score for h in hits]}
                if labelled:  # the passages' own ids and metadata (null where none)
                    out[r.index]["passage_ids"] = [h.id for h in hits]
                    out[r.index]["passage_metadata"] = [h.metadata for h in hits]
                if j in ranking.failed:
                    out[r.index]["error"] = ranking.failed[j]
    return [out[r.index] for r in rows]


def _answer_ircot(searcher: Searcher, batch: Sequence[QueryRow],
                  entities: list[list[str]] | None, mode: Mode, top_k: int, ircot: IRCoTOptions,
                  stage_seconds: dict[str, float] | None) -> dict[int, dict[str, Any]]:
    """{row index: answer} of one batch by the IRCoT loop."""
    report = ircot_retrieve(searcher, [r.query for r in batch], ircot.reason,
                            max_steps=ircot.max_steps, top_k=top_k, mode=mode,
                            query_entities=entities)
    if stage_seconds is not None:
        for k, v in report.stage_seconds.items():
            stage_seconds[k] = stage_seconds.get(k, 0.0) + v
    return {r.index: _ircot_answer(r, res) for r, res in zip(batch, report.results)}


def _ircot_answer(row: QueryRow, res: IRCoTResult) -> dict[str, Any]:
    answer: dict[str, Any] = {"id": row.id, "keys": [h.key for h in res.hits],
                              "titles": [h.title for h in res.hits],
                              "scores": [h.score for h in res.hits],
                              "thoughts": res.thoughts, "steps": res.steps, "stop": res.stop}
    if res.failed:
        answer["error"] = res.error
    elif res.error is not None:
        answer["stop_error"] = res.error
    return answer


def _explained(searcher: Searcher, texts: list[str], top_k: int, mode: Mode,
               ents: list[list[str]] | None) -> list[dict[str, Any]]:
    """{"keys", "titles", "scores", *EXPLAIN_COLUMNS} (or "error") of each query."""
    failed: dict[int, str] = {}
    try:
        explained = searcher.explain(texts, top_k=top_k, mode=mode, query_entities=ents)
    except QueryFailure as failure:
        explained, failed = failure.explanations or [], failure.failures
    out = []
    for j, ex in enumerate(explained):
        hits = [h.hit for h in ex.hits]
        answer = {"keys": [h.key for h in hits], "titles": [h.title for h in hits],
                  "scores": [h.score for h in hits], **explain_columns(ex)}
        if j in failed:
            answer["error"] = failed[j]
        out.append(answer)
    return out


def explain_columns(e: QueryExplanation) -> dict[str, Any]:
    """The EXPLAIN_COLUMNS of one query (module docstring): per hit, one term per seed in the
    order of "seeds"."""
    order = [s.phrase for s in e.seeds]

    def finite(x: float) -> float | None:
        return x if math.isfinite(x) else None

    def terms(h: Any) -> list[float]:
        by_phrase = {s.phrase: s.contribution for s in h.seeds}
        return [by_phrase.get(p, 0.0) for p in order]

    return {
        "seeds": [{"phrase": s.phrase, "weight": s.weight, "share": s.share} for s in e.seeds],
        "contributions": [terms(h) for h in e.hits],
        "dense": [None if h.dense is None else h.dense.total for h in e.hits],
        "offset": [h.offset for h in e.hits],
        "value": [h.value for h in e.hits],
        "bound": [finite(h.bound) for h in e.hits],
        "fused_ranks": None if not e.hits or e.hits[0].fusion is None else [
            {"ppr": h.fusion.ppr_rank, "dense": h.fusion.dense_rank,
             "entity": -1 if h.fusion.entity_rank is None else h.fusion.entity_rank}
            for h in e.hits if h.fusion is not None],
    }


def _answer(searcher: Searcher, rows: Sequence[QueryRow], mode: Mode, top_k: int,
            batch_size: int, report: BatchReport, ircot: IRCoTOptions | None = None,
            explain: bool = False) -> tuple[list[str], list[str]]:
    """(JSON lines of the answers to `rows`, in order; JSON lines of the rows whose retrieval
    failed, {"row", "id", "error"}: they go to the side file, not the output)."""
    answers = answer_rows(searcher, rows, mode=mode, top_k=top_k, batch_size=batch_size,
                          stage_seconds=report.stage_seconds, ircot=ircot, explain=explain)
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


def _failed_file(parts: RunParts, n: int) -> Path:
    """Part n's side file of failed rows: part-NNNNNN.failed.jsonl."""
    return parts.path(n).with_suffix(".failed.jsonl")


def _join_parts(paths: Sequence[Path], out: Path, fmt: str, ircot: bool = False,
                explain: bool = False) -> None:
    """Write the JSON Lines parts `paths`, in order, to `out` atomically, in its format
    (`ircot`, `explain`: the Parquet schema has their columns)."""
    if fmt == "jsonl":
        def concatenate(tmp: Path) -> None:
            with tmp.open("w", encoding="utf-8") as f:
                for path in paths:
                    with path.open(encoding="utf-8") as g:
                        shutil.copyfileobj(g, f)

        write_atomic(out, concatenate)
        return

    def chunks() -> Iterator[list[dict[str, Any]]]:
        for path in paths:
            with path.open(encoding="utf-8") as g:
                yield [json.loads(line) for line in g]

    write_atomic(out, lambda tmp: _write_parquet_answers(tmp, chunks(), ircot, explain))


def _write_parquet_answers(path: Path, chunks: Iterable[list[dict[str, Any]]],
                           ircot: bool = False, explain: bool = False) -> None:
    import pyarrow as pa

    pq = _pyarrow_parquet()
    floats = pa.list_(pa.float64())
    fields = [("id", pa.string()), ("keys", pa.list_(pa.string())),
              ("titles", pa.list_(pa.string())), ("scores", floats)]
    if ircot:
        fields += [("thoughts", pa.list_(pa.string())), ("steps", pa.int64()),
                   ("stop", pa.string()), ("stop_error", pa.string())]
    if explain:
        fields += [
            ("seeds", pa.list_(pa.struct([("phrase", pa.string()), ("weight", pa.float64()),
                                          ("share", pa.float64())]))),
            ("contributions", pa.list_(floats)), ("dense", floats), ("offset", floats),
            ("value", floats), ("bound", floats),
            ("fused_ranks", pa.list_(pa.struct([("ppr", pa.int64()), ("dense", pa.int64()),
                                                ("entity", pa.int64())]))),
        ]
    chunks = iter(chunks)
    first = next(chunks, [])
    labelled = bool(first) and "passage_ids" in first[0]
    if labelled:  # metadata as JSON text: its objects have no one Parquet type
        fields += [("passage_ids", pa.list_(pa.string())),
                   ("passage_metadata", pa.list_(pa.string()))]
    schema = pa.schema(fields)
    with pq.ParquetWriter(path, schema) as writer:
        for rows in itertools.chain([first], chunks):
            rows = [{**r, "id": str(r["id"])} for r in rows]
            if labelled:
                rows = [{**r, "passage_metadata": [None if m is None else json.dumps(
                    m, ensure_ascii=False) for m in r.get("passage_metadata", [])]}
                    for r in rows]
            if rows:
                writer.write_table(pa.Table.from_pylist(rows, schema=schema))


def write_answers(out: str | Path, answers: Iterable[dict[str, Any]],
                  chunk_rows: int = 4096) -> None:
    """Write answer dicts (answer_rows' form) to `out` atomically, in the format the local
    command writes for that suffix (JSON Lines, or Parquet with string ids)."""
    out = Path(out)
    if out.suffix == ".parquet":
        def chunks() -> Iterator[list[dict[str, Any]]]:
            it = iter(answers)
            while chunk := [a for _, a in zip(range(chunk_rows), it)]:
                yield chunk

        write_atomic(out, lambda tmp: _write_parquet_answers(tmp, chunks()))
        return

    def lines(tmp: Path) -> None:
        with tmp.open("w", encoding="utf-8") as f:
            for a in answers:
                f.write(json.dumps(a, ensure_ascii=False) + "\n")

    write_atomic(out, lines)
