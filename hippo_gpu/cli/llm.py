"""CLI commands of the LLM layer: `hippo-gpu extract` and `hippo-gpu qa` (see `register`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from hippo_gpu.cli.common import LLM_HELP as _LLM_HELP
from hippo_gpu.cli.common import (
    console,
    fail,
    folder_hint,
    note_local_llm,
    parse_mode,
    ray_failure,
)
from hippo_gpu.cli.reasoning import (
    DATASET_HELP,
    MAX_STEPS_HELP,
    PASSAGES_HELP,
    PROMPT_HELP,
    check_max_steps,
    make_reasoner,
    reasoner_counts,
)

if TYPE_CHECKING:
    from hippo_gpu.data import Passage, Question
    from hippo_gpu.llm.backends import Backend
    from hippo_gpu.llm.cache import LLMCache
    from hippo_gpu.retrieval.results import Hit
    from hippo_gpu.retrieval.searcher import Searcher


def _backend_options(api_key_env: str, concurrency: int | None) -> dict[str, object]:
    """Options for `make_backend`; the API key is read from the environment here, in the CLI."""
    import os

    options: dict[str, object] = {}
    key = os.environ.get(api_key_env)
    if key:
        options["api_key"] = key
    if concurrency is not None:
        options["concurrency"] = concurrency
    return options


def _options_for(spec: str, options: dict[str, object]) -> dict[str, object]:
    # Only the OpenAI backend takes an API key and a concurrency; the local server has 1 slot.
    return options if spec.startswith("openai:") else {}


def extract(
    corpus: Path = typer.Option(..., help="corpus JSON: list of {title, text}"),
    llm: str = typer.Option(..., help=_LLM_HELP),
    out: Path = typer.Option(..., help="OpenIE JSON to write (HippoRAG v2 format, atomically)"),
    cache: Path | None = typer.Option(None, help="SQLite cache (default: OUT.cache.sqlite)"),
    max_entities: int = typer.Option(32, help="entities per passage (schema cap)"),
    max_triples: int = typer.Option(48, help="triples per passage (schema cap)"),
    wave_size: int = typer.Option(64, help="passages per backend batch"),
    concurrency: int | None = typer.Option(None, help="HTTP requests in flight (openai:)"),
    api_key_env: str = typer.Option("OPENAI_API_KEY", help="env var holding the API key"),
    ray: str | None = typer.Option(None, "--ray", metavar="ADDRESS|local",
                                   help="shard the passages over Ray tasks ('local' starts Ray "
                                        "here, 'auto' or ray://HOST:PORT joins a cluster); "
                                        "--llm may then list several openai: endpoints of one "
                                        "model, comma-separated, used round-robin by shard"),
    workers: int | None = typer.Option(None, min=1, help="--ray: shards in flight (default: "
                                                         "one per endpoint)"),
    shard_size: int = typer.Option(64, min=1, help="--ray: passages per Ray task"),
    retry_rounds: int = typer.Option(1, min=0, help="--ray: times failed passages are sent "
                                                    "again, to the next endpoint"),
) -> None:
    """Run OpenIE over a corpus with an LLM; resumes from the cache, retries failed passages."""
    from hippo_gpu.llm.extract import OpenIEConfig, extract_openie

    if corpus.is_dir():
        fail(folder_hint(corpus))
    config = OpenIEConfig(max_entities=max_entities, max_triples=max_triples)
    options = _options_for(llm, _backend_options(api_key_env, concurrency))
    note_local_llm(llm)
    started = False
    try:
        if ray is not None:
            from hippo_gpu.distributed.cluster import connect
            from hippo_gpu.distributed.ray_extract import extract_openie_ray

            specs = [s.strip() for s in llm.split(",") if s.strip()]
            started = connect(ray)
            report = extract_openie_ray(corpus, specs, out, cache_path=cache, config=config,
                                        shard_size=shard_size, wave_size=wave_size,
                                        workers=workers, retry_rounds=retry_rounds,
                                        backend_options=options)
        elif "," in llm:
            fail("several --llm endpoints need --ray")
        else:
            report = extract_openie(corpus, llm, out, cache_path=cache, config=config,
                                    wave_size=wave_size, backend_options=options)
    except (ValueError, OSError, ImportError) as e:
        fail(str(e))
    except Exception as e:
        if ray is None or type(e).__module__.split(".")[0] != "ray":
            raise
        fail(ray_failure(e))  # a Ray error, e.g. a shard's retries spent
    finally:
        if started:
            import ray as ray_module

            ray_module.shutdown()
    table = Table(title=f"OpenIE -> {out}")
    table.add_column("passages", justify="right")
    table.add_column("extracted", justify="right")
    table.add_column("cached", justify="right")
    table.add_column("failed", justify="right")
    table.add_column("passages/s", justify="right")
    table.add_column("tokens/s", justify="right")
    table.add_column("seconds", justify="right")
    table.add_row(str(report.passages), str(report.done), str(report.cached), str(report.failed),
                  f"{report.passages_per_s:.3f}", f"{report.tokens_per_s:.1f}",
                  f"{report.seconds:.1f}")
    console.print(table)
    if report.failures:
        console.print(f"failures by reason: {dict(report.failures)} (rerun to retry them)")
    console.print(f"parse: {report.parse.as_dict()}")


def qa(
    data: Path = typer.Option(..., help="folder with corpus.json and questions.json"),
    llm: str = typer.Option(..., help=_LLM_HELP),
    index: Path | None = typer.Option(None, help="index directory: loaded if it exists, else "
                                                 "built there"),
    openie: Path | None = typer.Option(None, help="OpenIE JSON for building the index "
                                                  "(default: extract it with --llm)"),
    top_k: int = typer.Option(5, help="passages fed to the reader"),
    mode: str = typer.Option("hipporag2", help="retrieval mode"),
    llm_filter: bool = typer.Option(False, "--filter/--no-filter",
                                    help="recognition-memory filter with --llm (hipporag2)"),
    limit: int | None = typer.Option(None, help="first N questions only"),
    cache: Path | None = typer.Option(None, help="SQLite LLM cache (default: next to the index)"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    concurrency: int | None = typer.Option(None, help="HTTP requests in flight (openai:)"),
    api_key_env: str = typer.Option("OPENAI_API_KEY", help="env var holding the API key"),
    out: Path | None = typer.Option(None, help="write predictions and metrics as JSON here"),
    ircot: bool = typer.Option(False, "--ircot", help="retrieve with the IRCoT loop (--llm "
                                                      "writes the thoughts); the reader reads "
                                                      "the merged list"),
    max_steps: int = typer.Option(3, help=MAX_STEPS_HELP),
    ircot_prompt: Path | None = typer.Option(None, help=PROMPT_HELP),
    dataset: str | None = typer.Option(None, help=DATASET_HELP + " (default: DATA's name)"),
    ircot_passages: int | None = typer.Option(None, min=0, help=PASSAGES_HELP),
) -> None:
    """Retrieve (one step, or --ircot), then read with an LLM: EM/F1 (SQuAD normalisation)
    next to recall."""
    _qa(QAOptions(
        data=data, llm=llm, index=index, openie=openie, top_k=top_k, mode=mode,
        llm_filter=llm_filter, limit=limit, cache=cache, device=device, concurrency=concurrency,
        api_key_env=api_key_env, out=out, ircot=ircot, max_steps=max_steps,
        ircot_prompt=ircot_prompt, dataset=dataset, ircot_passages=ircot_passages))


@dataclass(frozen=True)
class QAOptions:
    """What `hippo-gpu qa` was asked, one field per option (the command's help says each)."""

    data: Path
    llm: str
    index: Path | None
    openie: Path | None
    top_k: int
    mode: str
    llm_filter: bool
    limit: int | None
    cache: Path | None
    device: str
    concurrency: int | None
    api_key_env: str
    out: Path | None
    ircot: bool
    max_steps: int
    ircot_prompt: Path | None
    dataset: str | None
    ircot_passages: int | None


def _qa(o: QAOptions) -> None:
    """Open (or extract and build) the index, retrieve, read, then print and write the
    metrics."""
    from hippo_gpu.data import as_passages, read_questions
    from hippo_gpu.evaluate import qa_metrics, recall_at_k
    from hippo_gpu.llm.backends import make_backend
    from hippo_gpu.llm.cache import LLMCache
    from hippo_gpu.llm.qa import QAReader

    if o.ircot:
        check_max_steps(o.max_steps)
    try:
        passages = as_passages(o.data / "corpus.json")
        questions = read_questions(o.data / "questions.json")[:o.limit]
    except OSError as e:
        fail(str(e))
    index_dir = o.index or Path("runs") / f"qa-{o.data.name}"
    cache_path = o.cache or index_dir.with_name(index_dir.name + ".llm-cache.sqlite")
    backend = make_backend(o.llm, **_options_for(o.llm, _backend_options(o.api_key_env,
                                                                           o.concurrency)))
    with backend, LLMCache(cache_path) as llm_cache:
        t0 = time.perf_counter()
        searcher = _open_qa_index(o, index_dir, passages, backend, cache_path)
        t_index = time.perf_counter() - t0
        texts = [q.question for q in questions]
        t0 = time.perf_counter()
        hits, thoughts, ircot_counts = _qa_retrieve(o, searcher, texts, backend, llm_cache)
        t_retrieve = time.perf_counter() - t0
        contexts = [[searcher.index.passage_texts[h.row] for h in row[:o.top_k]]
                    for row in hits]
        reader = QAReader(backend, llm_cache, top_k=o.top_k)
        t0 = time.perf_counter()
        predictions = reader(texts, contexts)
        t_read = time.perf_counter() - t0
    recall = recall_at_k([[h.key for h in row] for row in hits],
                         [{p.key for p in q.gold} for q in questions], ks=(2, 5, 10))
    metrics = qa_metrics(predictions, [list(q.answers) for q in questions])
    how = f"{o.mode} + IRCoT {o.max_steps} steps" if o.ircot else o.mode
    table = Table(title=f"QA on {o.data} ({len(questions)} questions, {how}, {o.llm})")
    for col in ("R@2", "R@5", "R@10", "EM", "F1", "reader failures", "index s", "retrieve s",
                "read s"):
        table.add_column(col, justify="right")
    table.add_row(f"{recall['2']:.2f}", f"{recall['5']:.2f}", f"{recall['10']:.2f}",
                  f"{100 * metrics['em']:.2f}", f"{100 * metrics['f1']:.2f}",
                  str(sum(reader.failures.values())), f"{t_index:.1f}", f"{t_retrieve:.1f}",
                  f"{t_read:.1f}")
    console.print(table)
    if o.ircot:
        console.print(f"IRCoT: {ircot_counts['mean_steps']:.2f} steps per question, "
                      f"{ircot_counts['llm_calls']} LLM calls, {ircot_counts['cached']} cached, "
                      f"failures {ircot_counts['failures'] or 'none'}")
    if o.out is not None:
        _write_qa(o.out, questions, predictions, thoughts, recall=recall, metrics=metrics,
                  ircot_counts=ircot_counts if o.ircot else None)


def _open_qa_index(o: QAOptions, index_dir: Path, passages: list[Passage], backend: Backend,
                   cache_path: Path) -> Searcher:
    """The index at `index_dir`, else built there (from --openie, or from OpenIE extracted
    with the backend first)."""
    from hippo_gpu.indexing.build import build_index
    from hippo_gpu.llm.extract import extract_openie
    from hippo_gpu.retrieval.spec import SearcherSpec

    spec = SearcherSpec(index_dir, device=o.device)
    if index_dir.exists() and any(index_dir.iterdir()):
        return spec.open()
    openie = o.openie
    if openie is None:
        openie = index_dir.with_name(index_dir.name + ".openie.json")
        report = extract_openie(passages, backend, openie, cache_path=cache_path)
        console.print(f"OpenIE: {report.done} extracted, {report.cached} cached, "
                      f"{report.failed} failed ({report.passages_per_s:.3f} passages/s)")
    return spec.open(build_index(passages, openie, index_dir, device=o.device))


def _qa_retrieve(o: QAOptions, searcher: Searcher, texts: list[str], backend: Backend,
                 llm_cache: LLMCache) -> tuple[list[list[Hit]], list[list[str]] | None,
                                               dict[str, object]]:
    """(hits per question, IRCoT's thoughts per question or None, IRCoT's counts or {}): at
    least 10 hits each, for recall@10."""
    from hippo_gpu.llm.filter import RecognitionMemoryFilter
    from hippo_gpu.llm.ner import QueryNER
    from hippo_gpu.retrieval.ircot import ircot_retrieve

    fact_filter = RecognitionMemoryFilter(backend, llm_cache) if o.llm_filter else None
    entities = QueryNER(backend, llm_cache)(texts) if parse_mode(o.mode).linking == "entities" \
        else None
    if not o.ircot:
        return searcher.retrieve(texts, top_k=max(o.top_k, 10), mode=o.mode,
                                 fact_filter=fact_filter, query_entities=entities), None, {}
    reasoner = make_reasoner(backend, llm_cache, dataset=o.dataset or o.data.name,
                             prompt_file=o.ircot_prompt, max_passages=o.ircot_passages)
    looped = ircot_retrieve(searcher, texts, reasoner, max_steps=o.max_steps,
                            top_k=max(o.top_k, 10), mode=o.mode, fact_filter=fact_filter,
                            query_entities=entities)
    counts = {"max_steps": o.max_steps, **reasoner_counts(reasoner),
              "mean_steps": sum(r.steps for r in looped.results) / max(len(texts), 1),
              "stage_s": looped.stage_seconds}
    return [r.hits for r in looped.results], [r.thoughts for r in looped.results], counts


def _write_qa(out: Path, questions: list[Question], predictions: list[str],
              thoughts: list[list[str]] | None, *, recall: dict[str, float],
              metrics: dict[str, float], ircot_counts: dict[str, object] | None) -> None:
    """Predictions (with IRCoT's thoughts) and metrics as JSON."""
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"id": q.id, "question": q.question, "prediction": p, "answers": list(q.answers),
             **({"thoughts": thoughts[i]} if thoughts is not None else {})}
            for i, (q, p) in enumerate(zip(questions, predictions))]
    out.write_text(json.dumps({"recall": recall, "metrics": metrics, "rows": rows,
                               **({"ircot": ircot_counts} if ircot_counts is not None else {})},
                              indent=1))


def register(app: typer.Typer) -> None:
    """Add `extract` and `qa` to the hippo-gpu CLI."""
    app.command()(extract)
    app.command()(qa)
