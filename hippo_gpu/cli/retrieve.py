"""`hippo-gpu retrieve`: answer a file of queries in batches (resumable; see retrieval/batch.py);
`hippo-gpu query`: answer one question."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.table import Table

from hippo_gpu.cli.common import (
    LLM_HELP,
    QUERY_ENCODER_HELP,
    console,
    err_console,
    fail,
    parse_mode,
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
from hippo_gpu.errors import BLANK

STDIN = Path("-")  # --queries -

if TYPE_CHECKING:
    from hippo_gpu.retrieval.modes import Mode
    from hippo_gpu.retrieval.results import Hit
    from hippo_gpu.retrieval.searcher import Searcher
    from hippo_gpu.retrieval.spec import SearcherSpec


def retrieve(
    index: Path = typer.Option(..., help="index directory"),
    queries: Path = typer.Option(..., help='queries: JSON Lines or Parquet rows {"id", "query"'
                                           ', "entities"?}; "-" reads JSON Lines from stdin '
                                           "(not resumable)"),
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
    Every row is checked before any output is created, so a refused run leaves nothing behind.

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

    parse_mode(o.mode)
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
    if o.queries == STDIN and o.ray is not None:
        fail("--queries - (stdin) runs here: drop --ray, or give a file every node reads")
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
        with _queries_file(o.queries, o.out) as (queries, out):
            report = retrieve_file(searcher, queries, out, mode=o.mode, top_k=o.top_k,
                                   batch_size=o.batch_size, part_size=o.part_size,
                                   skip_bad=o.skip_bad, ircot=options, explain=o.explain)
            if queries != o.queries:  # read from stdin: OUT (and its side file) moved out
                report.bad_file = _move_beside(out, o.out, report.bad_file)
    except (FileNotFoundError, ImportError, ValueError) as e:
        fail(str(e))
    finally:
        if options is not None:
            reasoner.close()
    console.print(f"{report.rows} rows -> {o.out}: {report.answered} answered, {report.resumed} "
                  f"from committed parts, {report.bad} malformed, {report.failed} failed"
                  + (f" (see {report.bad_file})" if report.bad_file else "")
                  + f"; {report.queries_per_s:.1f} queries/s, {threads} threads")


@contextlib.contextmanager
def _queries_file(queries: Path, out: Path) -> Iterator[tuple[Path, Path]]:
    """(query file, output) for retrieve_file: `queries` and `out` themselves, or for
    `--queries -` stdin spooled into a hidden folder beside OUT (".OUT.stdin-*", removed when
    the run ends) and an output inside it, which `_move_beside` then renames to OUT. A run from
    stdin cannot be resumed (the rows come once), so its parts live and die in that folder."""
    if queries != STDIN:
        yield queries, out
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.stdin-") as tmp:
        spooled = Path(tmp) / "queries.jsonl"
        with spooled.open("wb") as f:
            shutil.copyfileobj(sys.stdin.buffer, f)
        yield spooled, Path(tmp) / out.name


def _move_beside(done: Path, out: Path, bad_file: str | None) -> str | None:
    """Rename a stdin run's output `done` (and its side file of bad rows, if any) to `out`;
    returns the side file's new name."""
    os.replace(done, out)
    if bad_file is None:
        return None
    bad = out.with_name(out.name + ".bad.jsonl")
    os.replace(bad_file, bad)
    return str(bad)


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


def query(
    index: Path = typer.Argument(..., help="index directory"),
    question: str = typer.Argument(..., help="the question"),
    mode: str = typer.Option("hipporag2", help=f"one of {MODES}"),
    top_k: int = typer.Option(5, min=1, help="passages to show"),
    entities: str | None = typer.Option(
        None, "--entities", help="hipporag1, hybrid: the question's named entities, "
                                 "comma-separated (default: its capitalised spans)"),
    explain: bool = typer.Option(False, "--explain",
                                 help="split each hit's score into one term per seed phrase "
                                      "and one for the dense prior (Searcher.explain)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object: the hits "
                                                       "(and the explanation) as served"),
    where: str | None = typer.Option(
        None, "--where", help='a metadata filter as JSON, e.g. \'{"year": 2020}\': only '
                              "passages whose own metadata match (applied after the PPR)"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    encoder: str | None = typer.Option(None, help=QUERY_ENCODER_HELP),
    threads: int | None = typer.Option(None, help="CPU threads"),
) -> None:
    """Answer one question: the top passages of an index for it (a query file, in batches and
    resumable: `retrieve`; a running service: `serve`)."""
    how = parse_mode(mode)
    wanted = _parse_where(where)
    if not question.strip():
        fail(f"the question {BLANK}")
    from hippo_gpu.retrieval.spec import SearcherSpec
    from hippo_gpu.storage.directory import is_index_dir

    if not is_index_dir(index):
        fail(f"{index} is not a hippo-gpu index")
    setup(threads)
    try:
        searcher = SearcherSpec(index, device=device, threads=threads,
                                encoder_model=encoder).open()
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    texts = searcher.index.passage_texts
    given = None if entities is None else \
        [[e.strip() for e in entities.split(",") if e.strip()]]
    if explain:
        _show_explained(searcher, index, question, how, top_k, as_json, given, wanted)
        return
    ranking = searcher.rank([question], top_k=top_k, mode=how, query_entities=given,
                            where=wanted)
    if ranking.failed:
        fail(f"the query has no answer: {ranking.failed[0]}")
    hits = searcher.to_hits(ranking)[0]
    version = searcher.index.version
    used = None if ranking.entities is None else ranking.entities[0]
    if as_json:
        print(json.dumps({"index": str(index), "version": version, "mode": how.name,
                          "question": question, **({} if used is None else {"entities": used}),
                          "hits": [_hit_json(h, texts) for h in hits]}, ensure_ascii=False))
        return
    table = _hit_table(f"{index} (version {version}), {how.name}: {question}")
    for h in hits:
        own = "" if h.id is None else f" [{escape(h.id)}]"  # the passage's own id
        table.add_row(str(h.rank + 1), f"{h.score:.4f}", escape(h.title) + own,
                      _short(texts[h.row]))
    console.print(table)
    _say_entities(how, used)


def _say_entities(mode: Mode, used: list[str] | None) -> None:
    """The entities a hipporag1 or hybrid answer linked, and what none of them means."""
    if used is None:
        return
    if used:
        console.print("entities: " + ", ".join(used), markup=False, highlight=False)
    elif mode.linking == "entities":
        err_console.print("no entity in the question (no capitalised span): hipporag1 scored "
                          "every passage alike; give them with --entities", markup=False)
    else:
        err_console.print("no entity in the question (no capitalised span): hybrid fused no "
                          "entity ranking", markup=False)


def _parse_where(text: str | None) -> dict[str, Any] | None:
    """--where's JSON, checked (a one-line error naming what is wrong)."""
    if text is None:
        return None
    from hippo_gpu.data import DataFormatError
    from hippo_gpu.indexing.labels import check_filter

    try:
        where = json.loads(text)
        check_filter(where)
    except json.JSONDecodeError as e:
        fail(f"--where is not JSON ({e.msg} at column {e.colno})")
    except DataFormatError as e:
        fail(f"--where: {e}")
    return dict(where)


def _show_explained(searcher: Searcher, where: Path, question: str, mode: Mode, top_k: int,
                    as_json: bool, entities: list[list[str]] | None,
                    wanted: dict[str, Any] | None = None) -> None:
    """`query --explain`: the hits with their scores split (one term per seed phrase, the
    dense prior, hipporag1's shift), as a table or JSON (explanation_dict)."""
    from hippo_gpu.retrieval.explanation import explanation_dict
    from hippo_gpu.retrieval.results import QueryFailure

    index = searcher.index
    try:
        ex = searcher.explain([question], top_k=top_k, mode=mode, query_entities=entities,
                              where=wanted)[0]
    except QueryFailure as e:
        fail(f"the query has no answer: {e.failures[0]}")
    if as_json:
        print(json.dumps({"index": str(where), "version": index.version, "mode": mode.name,
                          "question": question,
                          "explanation": explanation_dict(ex, index.passage_keys,
                                                          index.passage_titles,
                                                          index.passage_texts)},
                         ensure_ascii=False))
        return
    table = _hit_table(f"{where} (version {index.version}), {mode.name}: {question}")
    table.add_column("score = seed terms + dense + offset")
    for h in ex.hits:
        terms = [f"{s.phrase} {s.contribution:+.4f}" for s in h.seeds[:3]]
        if len(h.seeds) > 3:
            rest = sum(s.contribution for s in h.seeds[3:])
            terms.append(f"{len(h.seeds) - 3} more {rest:+.4f}")
        if h.dense is not None:
            terms.append(f"dense {h.dense.total:+.4f}")
        if h.offset:
            terms.append(f"offset {h.offset:+.4f}")
        table.add_row(str(h.hit.rank + 1), f"{h.hit.score:.4f}", h.hit.title,
                      _short(index.passage_texts[h.hit.row]), "\n".join(terms))
    console.print(table)
    if ex.seeds:
        console.print("seeds: " + ", ".join(f"{s.phrase} ({s.share:.0%})" for s in ex.seeds)
                      + f"; dense prior {ex.dense_share:.0%}", markup=False, highlight=False)
    elif ex.dense_answer:
        console.print("no fact was kept: the dense ranking answered", markup=False)
    _say_entities(mode, None if ex.entities is None else list(ex.entities))


def _hit_table(title: str) -> Table:
    table = Table(title=escape(title), title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("score", justify="right")
    table.add_column("title")
    table.add_column("text")
    return table


def _hit_json(h: Hit, texts: Sequence[str]) -> dict[str, Any]:
    from hippo_gpu.retrieval.results import label_fields

    return {"key": h.key, "title": h.title, "text": texts[h.row], "score": float(h.score),
            "rank": h.rank, **label_fields(h.id, h.metadata)}


def _short(text: str, limit: int = 160) -> str:
    return escape(text if len(text) <= limit else text[:limit - 1] + "…")


def register(app: typer.Typer) -> None:
    app.command()(retrieve)
    app.command()(query)
