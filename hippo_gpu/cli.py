"""Command line: `hippo-gpu demo | index | stats | eval | extract | qa | serve`."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.table import Table

from hippo_gpu.config import MODES, EncoderConfig, GraphConfig, RetrievalConfig

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="HippoRAG (v1 and 2) retrieval as batched tensor work on CPU and CUDA.")
console = Console()
err_console = Console(stderr=True, soft_wrap=True)


def _setup(threads: int | None, verbose: bool = False) -> int:
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


def _cache_root() -> Path:
    return Path(os.environ.get("HIPPO_GPU_CACHE", Path.home() / ".cache" / "hippo_gpu"))


def _fail(msg: str) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {msg}")
    raise typer.Exit(2)


def _timing_table(timings: dict[str, float], title: str) -> Table:
    table = Table(title=title)
    table.add_column("stage")
    table.add_column("seconds", justify="right")
    for k, v in timings.items():
        table.add_row(k, f"{v:.3f}")
    table.add_row("[bold]total", f"[bold]{sum(timings.values()):.3f}")
    return table


@app.command()
def index(
    corpus: Path = typer.Option(..., help="corpus JSON: list of {title, text}"),
    out: Path = typer.Option(..., help="index directory to write (atomically)"),
    openie: Path | None = typer.Option(None, help="OpenIE JSON (HippoRAG v1 or v2 format)"),
    llm: str | None = typer.Option(
        None, help="extract OpenIE first with this LLM (openai:MODEL@URL, vllm:MODEL, "
                   "local:smollm2)"),
    encoder: str = typer.Option(EncoderConfig.model, help="sentence-transformers name or path"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    threads: int | None = typer.Option(None, help="CPU threads (torch and faiss)"),
    precision: str = typer.Option("float32", help="encoder precision: float32 | bfloat16"),
    knn_backend: str = typer.Option("auto", help="auto | faiss-flat | faiss-hnsw | faiss-ivf | "
                                                 "faiss-gpu | torch"),
    allow_missing_openie: bool = typer.Option(
        False, help="index corpus passages the OpenIE file lacks, without triples"),
    cache_dir: Path | None = typer.Option(None, help="embedding cache (default: "
                                                        "$HIPPO_GPU_CACHE/embeddings)"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Build an index from a corpus and its OpenIE output (or extract it with --llm first)."""
    from hippo_gpu.data import DataFormatError
    from hippo_gpu.index import build_index

    n = _setup(threads, verbose)
    if (openie is None) == (llm is None):
        _fail("give exactly one of --openie FILE or --llm SPEC")
    if llm is not None:
        from hippo_gpu.llm.extract import extract_openie

        openie = out.parent / f"{out.name}.openie.json"
        console.print(f"extracting OpenIE with {llm} -> {openie}")
        report = extract_openie(corpus, llm, openie, cache_path=_cache_root() / "llm_cache.sqlite")
        console.print(str(report))
    openie_path: Path = openie  # type: ignore[assignment]  # set by one branch above
    try:
        idx = build_index(
            corpus, openie_path, out,
            encoder=EncoderConfig(model=encoder, precision=precision),
            device=device, graph=GraphConfig(knn_backend=knn_backend),
            cache_dir=cache_dir or _cache_root() / "embeddings",
            allow_missing_openie=allow_missing_openie, show_progress=True,
        )
    except (DataFormatError, ValueError) as e:
        _fail(str(e))
    console.print(_timing_table(idx.timings, f"index built in {out} ({n} threads)"))
    console.print_json(json.dumps(idx.stats()))


@app.command()
def stats(path: Path = typer.Argument(..., help="index directory"),
          as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Print an index's counts (upstream graph_info definitions)."""
    from hippo_gpu.index import load_index
    from hippo_gpu.store import IndexFormatError

    try:
        s = load_index(path, device="cpu").stats()
    except IndexFormatError as e:
        _fail(str(e))
    if as_json:
        print(json.dumps(s))
        return
    table = Table(title=str(path))
    table.add_column("count")
    table.add_column("value", justify="right")
    for k, v in s.items():
        table.add_row(k, str(v))
    console.print(table)


def _find_openie(data: Path) -> Path:
    found = sorted(data.glob("openie*.json"))
    if len(found) != 1:
        _fail(f"{data}: expected exactly one openie*.json, found {len(found)}; pass --openie")
    return found[0]


def _file_digest(*paths: Path, extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _build_or_load(corpus: Path, openie: Path, index_dir: Path | None, encoder: str,
                   device: str, precision: str = "float32"):
    from hippo_gpu.index import build_index, load_index
    from hippo_gpu.store import IndexFormatError

    enc = EncoderConfig(model=encoder, precision=precision)
    if index_dir is None:
        digest = _file_digest(corpus, openie, extra=json.dumps(enc.identity(), sort_keys=True))
        index_dir = _cache_root() / "indexes" / f"{corpus.parent.name}-{digest}"
    if (index_dir / "manifest.json").exists():
        try:
            return load_index(index_dir, device=device, encoder=encoder), index_dir, False
        except IndexFormatError as e:
            err_console.print(f"[yellow]rebuilding {index_dir}: {e}")
    idx = build_index(corpus, openie, index_dir, encoder=enc, device=device,
                      cache_dir=_cache_root() / "embeddings", show_progress=True)
    return idx, index_dir, True


@app.command("eval")
def eval_cmd(
    data: Path = typer.Option(..., help="dir with questions.json, corpus.json, openie*.json"),
    openie: Path | None = typer.Option(None, help="OpenIE file (default: DIR/openie*.json)"),
    modes: str = typer.Option("dense,hipporag2,hybrid", help=f"comma list of {MODES}"),
    top_k: int = typer.Option(200, help="passages ranked per query"),
    threads: int | None = typer.Option(None, help="CPU threads"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    encoder: str = typer.Option(EncoderConfig.model, help="encoder name or path"),
    index_dir: Path | None = typer.Option(None, help="index to reuse/build (default: cache)"),
    dtype: str = typer.Option("float32", help="PPR dtype: float32 | float64"),
    query_precision: str | None = typer.Option(
        None, help="query encoder precision (default: the index's; bfloat16 is ~3x faster)"),
    query_ner: Path | None = typer.Option(
        None, help="hipporag1: HippoRAG *_queries.named_entity_output.tsv"),
    llm: str | None = typer.Option(
        None, help="LLM for hipporag1 query NER and the hipporag2 filter (--filter)"),
    use_filter: bool = typer.Option(False, "--filter", help="hipporag2: LLM recognition memory"),
    json_out: Path | None = typer.Option(None, "--json", help="write results as JSON"),
    per_query: Path | None = typer.Option(None, help="write top-10 keys per question (JSON)"),
    questions_limit: int | None = typer.Option(None, "--limit", help="first N questions"),
) -> None:
    """Recall@k, queries/s and time per stage for each retrieval mode."""
    import torch

    from hippo_gpu.data import read_questions
    from hippo_gpu.evaluate import evaluate_mode

    n = _setup(threads)
    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    for m in mode_list:
        if m not in MODES:
            _fail(f"unknown mode {m!r}; choose from {MODES}")
    openie = openie or _find_openie(data)
    questions = read_questions(data / "questions.json")[:questions_limit]
    idx, where, built = _build_or_load(data / "corpus.json", openie, index_dir, encoder, device)
    if query_precision is not None:
        idx = idx.with_query_encoder(precision=query_precision)
    console.print(f"index: {where} ({'built' if built else 'reused'}), {len(questions)} questions, "
                  f"device {idx.device}, {n} threads")
    cfg = RetrievalConfig(dtype=dtype)
    entities = None
    if "hipporag1" in mode_list:
        entities = _query_entities(questions, query_ner, llm)
        if entities is None:
            err_console.print("[yellow]skipping hipporag1: it needs query entities; pass "
                              "--query-ner FILE.tsv or --llm SPEC")
            mode_list.remove("hipporag1")
    fact_filter = None
    if use_filter:
        if llm is None:
            _fail("--filter needs --llm SPEC")
        from hippo_gpu.llm.filter import RecognitionMemoryFilter

        fact_filter = RecognitionMemoryFilter(llm)  # owns (and closes) its backend
    results = {}
    try:
        for m in mode_list:
            results[m] = evaluate_mode(idx, questions, m, top_k=top_k, config=cfg,
                                       fact_filter=fact_filter if m == "hipporag2" else None,
                                       query_entities=entities if m == "hipporag1" else None)
    finally:
        if fact_filter is not None:
            fact_filter.close()
    ks = list(next(iter(results.values())).recall) if results else []
    table = Table(title=f"Recall@k (%) on {data.name}, {len(questions)} questions")
    table.add_column("mode")
    for k in ks:
        table.add_column(f"R@{k}", justify="right")
    table.add_column("q/s", justify="right")
    table.add_column("fallbacks", justify="right")
    for m, r in results.items():
        table.add_row(m, *[f"{r.recall[k]:.2f}" for k in ks], f"{r.queries_per_s:.1f}",
                      str(r.dense_fallbacks))
    console.print(table)
    for m, r in results.items():
        console.print(f"{m} stages (s): " + ", ".join(f"{k} {v:.3f}" for k, v in r.stage_s.items()))
    if json_out:
        payload = {"modes": {m: r.as_dict() for m, r in results.items()},
                   "n_questions": len(questions), "index": idx.stats(), "threads": n,
                   "device": str(idx.device), "torch": torch.__version__}
        json_out.write_text(json.dumps(payload, indent=2))
    if per_query:
        dump = [{"id": q.id, "question": q.question,
                 **{m: r.ranked_keys[i][:10] for m, r in results.items()}}
                for i, q in enumerate(questions)]
        per_query.write_text(json.dumps(dump, indent=1))


def _query_entities(questions, query_ner: Path | None, llm: str | None):
    texts = [q.question for q in questions]
    if query_ner is not None:
        from hippo_gpu.llm.ner import read_query_ner_tsv

        table = read_query_ner_tsv(query_ner)
        return [table.get(t, []) for t in texts]
    if llm is not None:
        from hippo_gpu.llm.ner import QueryNER

        ner = QueryNER(llm)  # owns its backend
        try:
            return ner(texts)
        finally:
            ner.close()
    return None


@app.command()
def demo(
    top_k: int = typer.Option(3, help="passages shown per question"),
    threads: int | None = typer.Option(None, help="CPU threads"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
) -> None:
    """Index the bundled sample corpus and answer its multi-hop questions."""
    import tempfile

    from hippo_gpu.data import read_questions
    from hippo_gpu.index import build_index
    from hippo_gpu.sample import paths
    from hippo_gpu.search import Hit

    n = _setup(threads)
    files = paths()
    with tempfile.TemporaryDirectory() as tmp:
        idx = build_index(files["corpus"], files["openie"], Path(tmp) / "index", device=device)
        console.print(f"[bold]indexed the sample corpus[/] ({n} threads, {idx.device}): "
                      + ", ".join(f"{k} {v}" for k, v in idx.stats().items()
                                  if k in ("phrase_nodes", "passage_nodes", "facts",
                                           "synonym_edges", "edges")))
        questions = read_questions(files["questions"])
        texts = [q.question for q in questions]
        for mode in ("dense", "hipporag2"):
            hits: list[list[Hit]] = idx.retrieve(texts, top_k=top_k, mode=mode)
            found = 0
            console.rule(f"mode {mode}")
            for q, row in zip(questions, hits):
                gold = {p.key for p in q.gold}
                found += len(gold & {h.key for h in row})
                console.print(f"[bold]Q:[/] {q.question}  [dim](answer: {q.answers[0]})")
                for h in row:
                    mark = "[green]*[/]" if h.key in gold else " "
                    console.print(f"  {mark} {h.rank + 1}. {h.title}  [dim]{h.score:.4f}")
            total = sum(len(q.gold) for q in questions)
            console.print(f"[bold]{mode}: {found}/{total} supporting passages in the top "
                          f"{top_k} (* marks them)")


def _register_optional() -> None:
    """Commands that live in other modules (LLM layer, server)."""
    for module in ("hippo_gpu.llm.commands", "hippo_gpu.serve_cli"):
        try:
            mod = __import__(module, fromlist=["register"])
        except ImportError as e:
            logging.getLogger(__name__).debug("commands of %s unavailable: %s", module, e)
            continue
        mod.register(app)


_register_optional()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
