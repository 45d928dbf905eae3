"""`hippo-gpu demo`: index the bundled sample corpus and answer its multi-hop questions."""

from __future__ import annotations

from pathlib import Path

import typer

from hippo_gpu.cli.common import console, setup


def demo(
    top_k: int = typer.Option(3, help="passages shown per question"),
    threads: int | None = typer.Option(None, help="CPU threads"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
) -> None:
    """Index the bundled sample corpus and answer its multi-hop questions."""
    import tempfile

    from hippo_gpu.build import build_index
    from hippo_gpu.data import read_questions
    from hippo_gpu.sample import paths
    from hippo_gpu.search import Searcher

    n = setup(threads)
    files = paths()
    with tempfile.TemporaryDirectory() as tmp:
        idx = build_index(files["corpus"], files["openie"], Path(tmp) / "index", device=device)
        console.print(f"[bold]indexed the sample corpus[/] ({n} threads, {idx.device}): "
                      + ", ".join(f"{k} {v}" for k, v in idx.stats().items()
                                  if k in ("phrase_nodes", "passage_nodes", "facts",
                                           "synonym_edges", "edges")))
        questions = read_questions(files["questions"])
        texts = [q.question for q in questions]
        searcher = Searcher(idx)
        for mode in ("dense", "hipporag2"):
            hits = searcher.retrieve(texts, top_k=top_k, mode=mode)
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


def register(app: typer.Typer) -> None:
    app.command()(demo)
