"""`hippo-gpu eval`: Recall@k, queries/s and time per stage for each retrieval mode, and with
--ircot the same modes inside the IRCoT loop (hippo_gpu.retrieval.ircot)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from hippo_gpu.cli.common import ENCODER_HELP, console, err_console, fail, parse_mode, setup
from hippo_gpu.cli.reasoning import (
    DATASET_HELP,
    MAX_STEPS_HELP,
    PASSAGES_HELP,
    PROMPT_HELP,
    check_max_steps,
    make_reasoner,
    reasoner_counts,
)
from hippo_gpu.config import MODES, EncoderConfig, RetrievalConfig, cache_root

if TYPE_CHECKING:
    from hippo_gpu.data import Question
    from hippo_gpu.evaluate import IRCoTModeResult, ModeResult
    from hippo_gpu.llm.filter import RecognitionMemoryFilter
    from hippo_gpu.llm.ircot import IRCoTReasoner
    from hippo_gpu.retrieval.modes import Mode
    from hippo_gpu.retrieval.searcher import Searcher
    from hippo_gpu.retrieval.spec import SearcherSpec


def _find_openie(data: Path) -> Path:
    found = sorted(data.glob("openie*.json"))
    if len(found) != 1:
        fail(f"{data}: expected exactly one openie*.json, found {len(found)}; pass --openie")
    return found[0]


def _file_digest(*paths: Path, extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _index_dir(corpus: Path, openie: Path, index_dir: Path | None, encoder: str) -> Path:
    """The given index directory, else the cache's for corpus + openie + encoder."""
    if index_dir is not None:
        return index_dir
    enc = EncoderConfig(model=encoder)
    digest = _file_digest(corpus, openie, extra=json.dumps(enc.identity(), sort_keys=True))
    return cache_root() / "indexes" / f"{corpus.parent.name}-{digest}"


def _open_or_build(spec: SearcherSpec, corpus: Path, openie: Path) -> tuple[Searcher, bool]:
    """(searcher, built): the spec's index opened, or (absent or incompatible) built from
    corpus + openie with the spec's encoder model at its precision, then opened."""
    from hippo_gpu.indexing.build import build_index
    from hippo_gpu.indexing.index import IndexFormatError

    if (spec.index / "manifest.json").exists():
        try:
            return spec.open(), False
        except IndexFormatError as e:
            err_console.print(f"[yellow]rebuilding {spec.index}: {e}")
    idx = build_index(corpus, openie, spec.index,
                      encoder=EncoderConfig(model=spec.encoder_model or EncoderConfig.model),
                      device=spec.device, cache_dir=cache_root() / "embeddings",
                      show_progress=True, precision=spec.precision)
    return spec.open(idx), True


def eval_cmd(
    data: Path = typer.Option(..., help="dir with questions.json, corpus.json, openie*.json"),
    openie: Path | None = typer.Option(None, help="OpenIE file (default: DIR/openie*.json)"),
    modes: str = typer.Option("dense,hipporag2,hybrid", help=f"comma list of {MODES}"),
    top_k: int = typer.Option(200, help="passages ranked per query"),
    threads: int | None = typer.Option(None, help="CPU threads"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    encoder: str = typer.Option(EncoderConfig.model, help=ENCODER_HELP),
    index_dir: Path | None = typer.Option(None, help="index to reuse/build (default: cache)"),
    dtype: str = typer.Option("float32", help="PPR dtype: float32 | float64"),
    precision: str = typer.Option(
        "float32", help="embedding/score precision on the device: float32 | float16 | bfloat16"),
    query_precision: str | None = typer.Option(
        None, help="query encoder precision (default: the index's); bfloat16 is faster only "
                   "on CPUs with AMX and makes rankings depend on the batch (README)"),
    query_backend: str = typer.Option(
        "auto", help="query encoder: auto (ONNX Runtime when installed and at parity, else "
                     "torch) | torch | onnx"),
    query_ner: Path | None = typer.Option(
        None, help="query entities for hipporag1 and hybrid: HippoRAG "
                   "*_queries.named_entity_output.tsv (default: capitalised spans)"),
    llm: str | None = typer.Option(
        None, help="LLM for query NER (hipporag1, hybrid), the hipporag2 filter (--filter) "
                   "and the IRCoT thoughts (--ircot)"),
    use_filter: bool = typer.Option(False, "--filter", help="hipporag2: LLM recognition memory"),
    json_out: Path | None = typer.Option(None, "--json", help="write results as JSON"),
    per_query: Path | None = typer.Option(None, help="write top-10 keys per question (JSON)"),
    questions_limit: int | None = typer.Option(None, "--limit", help="first N questions"),
    ircot: bool = typer.Option(False, "--ircot", help="also run each mode in the IRCoT loop "
                                                      "with --llm (recall of the merged list)"),
    max_steps: int = typer.Option(3, help=MAX_STEPS_HELP),
    ircot_prompt: Path | None = typer.Option(None, help=PROMPT_HELP),
    dataset: str | None = typer.Option(None, help=DATASET_HELP + " (default: DATA's name)"),
    ircot_passages: int | None = typer.Option(None, min=0, help=PASSAGES_HELP),
    llm_cache: Path | None = typer.Option(
        None, help="SQLite cache of the IRCoT thoughts (default: beside the index)"),
) -> None:
    """Recall@k, queries/s and time per stage for each retrieval mode (--ircot: and in the
    IRCoT loop)."""
    _evaluate(EvalOptions(
        data=data, openie=openie, modes=modes, top_k=top_k, threads=threads, device=device,
        encoder=encoder, index_dir=index_dir, dtype=dtype, precision=precision,
        query_precision=query_precision, query_backend=query_backend, query_ner=query_ner,
        llm=llm, use_filter=use_filter, json_out=json_out, per_query=per_query,
        questions_limit=questions_limit, ircot=ircot, max_steps=max_steps,
        ircot_prompt=ircot_prompt, dataset=dataset, ircot_passages=ircot_passages,
        llm_cache=llm_cache))


@dataclass(frozen=True)
class EvalOptions:
    """What `hippo-gpu eval` was asked, one field per option (the command's help says each)."""

    data: Path
    openie: Path | None
    modes: str  # a comma list of MODES
    top_k: int
    threads: int | None
    device: str
    encoder: str
    index_dir: Path | None
    dtype: str
    precision: str
    query_precision: str | None
    query_backend: str
    query_ner: Path | None
    llm: str | None
    use_filter: bool
    json_out: Path | None
    per_query: Path | None
    questions_limit: int | None
    ircot: bool
    max_steps: int
    ircot_prompt: Path | None
    dataset: str | None
    ircot_passages: int | None
    llm_cache: Path | None


def _evaluate(o: EvalOptions) -> None:
    """Open (or build) the index, evaluate each mode (and in the IRCoT loop), print the tables
    and write what --json and --per-query ask for."""
    from hippo_gpu.data import read_questions
    from hippo_gpu.retrieval.options import SearcherOptions
    from hippo_gpu.retrieval.spec import SearcherSpec

    n = setup(o.threads)
    mode_list = [parse_mode(m) for m in o.modes.split(",") if m.strip()]
    openie = o.openie or _find_openie(o.data)
    questions = read_questions(o.data / "questions.json")[:o.questions_limit]
    corpus = o.data / "corpus.json"
    cfg = RetrievalConfig(dtype=o.dtype)
    try:
        spec = SearcherSpec(_index_dir(corpus, openie, o.index_dir, o.encoder), device=o.device,
                            precision=o.precision, config=cfg, encoder_model=o.encoder,
                            options=SearcherOptions(query_precision=o.query_precision,
                                                    query_backend=o.query_backend))
        searcher, built = _open_or_build(spec, corpus, openie)
    except ValueError as e:
        fail(str(e))
    idx, where = searcher.index, spec.index
    console.print(f"index: {where} ({'built' if built else 'reused'}), {len(questions)} questions, "
                  f"device {idx.device}, precision {idx.precision}, {n} threads")
    entities, entity_source = None, "capitalised spans"
    if any(m.reads_entities for m in mode_list):
        entities, entity_source = _query_entities(questions, o.query_ner, o.llm)
        console.print(f"query entities (hipporag1, hybrid): {entity_source}")
    reasoner = None
    if o.ircot:
        check_max_steps(o.max_steps)
        if o.llm is None:
            fail("--ircot needs --llm SPEC (the LLM that writes the thoughts)")
        cache = o.llm_cache or where.with_name(where.name + ".llm-cache.sqlite")
        reasoner = make_reasoner(o.llm, cache, dataset=o.dataset or o.data.name,
                                 prompt_file=o.ircot_prompt, max_passages=o.ircot_passages)
    fact_filter = None
    if o.use_filter:
        if o.llm is None:
            fail("--filter needs --llm SPEC")
        from hippo_gpu.llm.filter import RecognitionMemoryFilter

        fact_filter = RecognitionMemoryFilter(o.llm)  # owns (and closes) its backend
    try:
        results = _eval_modes(searcher, questions, mode_list, o.top_k, cfg,
                              fact_filter=fact_filter, entities=entities)
        ircot_results = {} if reasoner is None else _eval_ircot(
            searcher, questions, mode_list, reasoner, max_steps=o.max_steps, top_k=o.top_k,
            cfg=cfg, fact_filter=fact_filter, entities=entities)
    finally:
        if fact_filter is not None:
            fact_filter.close()
        if reasoner is not None:
            reasoner.close()
    ks = _print_results(results, o.data.name, len(questions))
    if reasoner is not None:
        _print_ircot(ircot_results, ks, o.data.name, len(questions), reasoner)
    if o.json_out:
        _write_json(o, o.json_out, searcher, results, ircot_results, reasoner, threads=n,
                    entity_source=entity_source, n_questions=len(questions))
    if o.per_query:
        _write_per_query(o.per_query, questions, results, ircot_results)


def _eval_modes(searcher: Searcher, questions: list[Question], mode_list: list[Mode], top_k: int,
                cfg: RetrievalConfig, *, fact_filter: RecognitionMemoryFilter | None,
                entities: list[list[str]] | None) -> dict[str, ModeResult]:
    from hippo_gpu.evaluate import evaluate_mode
    from hippo_gpu.retrieval.modes import HIPPORAG2  # upstream's fact filter is HippoRAG 2's

    return {m.name: evaluate_mode(searcher, questions, m, top_k=top_k, config=cfg,
                                  fact_filter=fact_filter if m is HIPPORAG2 else None,
                                  query_entities=entities if m.reads_entities else None)
            for m in mode_list}


def _print_results(results: dict[str, ModeResult], data_name: str, n: int) -> list[str]:
    """The Recall@k table and each mode's stage times; returns the k's (as recall's keys)."""
    ks = list(next(iter(results.values())).recall) if results else []
    table = Table(title=f"Recall@k (%) on {data_name}, {n} questions")
    table.add_column("mode")
    for k in ks:
        table.add_column(f"R@{k}", justify="right")
    table.add_column("q/s", justify="right")
    table.add_column("fallbacks", justify="right")
    table.add_column("PPR bound", justify="right")
    table.add_column("refined", justify="right")
    table.add_column("failed", justify="right")
    for m, r in results.items():
        table.add_row(m, *[f"{r.recall[k]:.2f}" for k in ks], f"{r.queries_per_s:.1f}",
                      str(r.dense_fallbacks), f"{r.ppr_max_bound:.2g}", str(r.ppr_refined),
                      str(r.failed))
    console.print(table)
    for m, r in results.items():
        console.print(f"{m} stages (s): " + ", ".join(f"{k} {v:.3f}" for k, v in r.stage_s.items()))
    return ks


def _write_json(o: EvalOptions, path: Path, searcher: Searcher, results: dict[str, ModeResult],
                ircot_results: dict[str, IRCoTModeResult], reasoner: IRCoTReasoner | None, *,
                threads: int, entity_source: str, n_questions: int) -> None:
    import torch

    idx = searcher.index
    payload = {"modes": {m: r.as_dict() for m, r in results.items()},
               **({"ircot": {m: r.as_dict() for m, r in ircot_results.items()},
                   "ircot_llm": {"spec": o.llm, **reasoner_counts(reasoner)}}
                  if reasoner is not None else {}),
               "n_questions": n_questions, "index": idx.stats(), "threads": threads,
               "device": str(idx.device), "precision": idx.precision,
               "query_precision": searcher.encoder_config.precision,
               "query_backend": searcher.encoder.backend,
               "ppr_dtype": o.dtype, "entities": entity_source, "torch": torch.__version__}
    path.write_text(json.dumps(payload, indent=2))


def _write_per_query(path: Path, questions: list[Question], results: dict[str, ModeResult],
                     ircot_results: dict[str, IRCoTModeResult]) -> None:
    """The top-10 keys of each question per mode (and IRCoT's, with its thoughts)."""
    dump = [{"id": q.id, "question": q.question,
             **{m: r.ranked_keys[i][:10] for m, r in results.items()},
             **{f"{m}+ircot": r.ranked_keys[i][:10] for m, r in ircot_results.items()},
             **({"thoughts": {m: r.thoughts[i] for m, r in ircot_results.items()}}
                if ircot_results else {})}
            for i, q in enumerate(questions)]
    path.write_text(json.dumps(dump, indent=1))


def _eval_ircot(searcher: Searcher, questions: list[Question], mode_list: list[Mode],
                reasoner: IRCoTReasoner, *, max_steps: int, top_k: int, cfg: RetrievalConfig,
                fact_filter: object, entities: list[list[str]] | None
                ) -> dict[str, IRCoTModeResult]:
    from hippo_gpu.evaluate import evaluate_ircot
    from hippo_gpu.retrieval.modes import HIPPORAG2

    out = {}
    for m in mode_list:
        out[m.name] = evaluate_ircot(
            searcher, questions, m, reasoner, max_steps=max_steps, top_k=top_k, config=cfg,
            fact_filter=fact_filter if m is HIPPORAG2 else None,  # type: ignore[arg-type]
            query_entities=entities if m.reads_entities else None)
    return out


def _print_ircot(results: dict[str, IRCoTModeResult], ks: list[str], data_name: str,
                 n: int, reasoner: IRCoTReasoner) -> None:
    steps = next(iter(results.values())).max_steps if results else 0
    table = Table(title=f"IRCoT ({steps} steps) Recall@k (%) of the merged list on {data_name}, "
                        f"{n} questions")
    table.add_column("mode")
    for k in ks:
        table.add_column(f"R@{k}", justify="right")
    for col in ("steps/q", "answered", "failed", "thoughts", "retrieve s", "reason s"):
        table.add_column(col, justify="right")
    for m, r in results.items():
        table.add_row(m, *[f"{r.recall[k]:.2f}" for k in ks], f"{r.mean_steps:.2f}",
                      str(r.stops["answer"]),
                      str(r.stops["thought_failed"] + r.stops["retrieval_failed"]),
                      str(r.thought_requests), f"{r.stage_s.get('retrieve', 0.0):.3f}",
                      f"{r.stage_s.get('reason', 0.0):.3f}")
    console.print(table)
    counts = reasoner_counts(reasoner)
    console.print(f"IRCoT LLM: {counts['llm_calls']} calls, {counts['cached']} cached, "
                  f"failures {counts['failures'] or 'none'}, prompt {counts['prompt']}")


def _query_entities(questions, query_ner: Path | None,
                    llm: str | None) -> tuple[list[list[str]], str]:
    """Entities per question and where they came from: a NER file, an LLM, else the
    capitalised-span heuristic (hippo_gpu.retrieval.entities)."""
    texts = [q.question for q in questions]
    if query_ner is not None:
        from hippo_gpu.llm.ner import read_query_ner_tsv

        table = read_query_ner_tsv(query_ner)
        return [table.get(t, []) for t in texts], f"NER file {query_ner.name}"
    if llm is not None:
        from hippo_gpu.llm.ner import QueryNER

        ner = QueryNER(llm)  # owns its backend
        try:
            return ner(texts), f"LLM {llm}"
        finally:
            ner.close()
    from hippo_gpu.retrieval.entities import heuristic_entities

    return heuristic_entities(texts), "capitalised spans"


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_cmd)
