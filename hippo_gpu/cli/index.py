"""`hippo-gpu corpus` (a folder of text files -> corpus JSON), `index` (build), `stats` (counts),
`insert` / `delete` (change it in place, atomically), `compact` (fold the segments into a new
base, drop old versions)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer
from rich.table import Table

from hippo_gpu.cli.common import (
    ENCODER_HELP,
    LLM_HELP,
    console,
    fail,
    folder_hint,
    note_local_llm,
    setup,
    timing_table,
)
from hippo_gpu.config import EncoderConfig, GraphConfig, RemoteEncoderConfig, cache_root


def _passages(corpus: Path, openie: Path | None, llm: str | None) -> list:
    """Read the corpus once, after checking that exactly one OpenIE source is given."""
    from hippo_gpu.data import as_passages

    if (openie is None) == (llm is None):
        fail("give exactly one of --openie FILE or --llm SPEC")
    if corpus.is_dir():
        fail(folder_hint(corpus))
    try:
        return as_passages(corpus)
    except OSError as e:
        fail(str(e))


def _extract(passages: list, llm: str, out: Path | None) -> list:
    """The LLM's OpenIE of `passages` as OpenIEDoc objects, also written to `out` when given
    (crash-safe: rerunning reuses the LLM cache)."""
    from hippo_gpu.llm.extract import extract_openie

    console.print(f"extracting OpenIE with {llm}" + (f" -> {out}" if out is not None else ""))
    note_local_llm(llm)
    report = extract_openie(passages, llm, out, cache_path=cache_root() / "llm_cache.sqlite")
    console.print(str(report))
    return report.docs


def _check_out(out: Path, replace: bool) -> None:
    """Refuse at once an --out the build would destroy or could not write, before anything is
    read, loaded or created: a file; an existing index without --replace, or one a writer or a
    writable server holds (the server's next write would undo the build); a non-empty folder
    that is no index (its files are not the build's to remove); a place under a file or a
    folder this user cannot write."""
    from hippo_gpu.storage.directory import IndexFormatError, is_index_dir, read_manifest
    from hippo_gpu.storage.locks import WRITER_LOCK, holder_of

    if out.exists() and not out.is_dir():
        fail(f"--out {out} is a file; give a new or empty directory")
    if is_index_dir(out):
        if not replace:
            try:
                version = f" (version {read_manifest(out).get('version')})"
            except IndexFormatError:
                version = ""
            fail(f"--out {out} already holds an index{version}; pass --replace to replace it, "
                 "or give another directory")
        holder = holder_of(out)
        if holder is not None:
            fail(f"--out {out}: {holder} holds this index, and replacing it would undo its "
                 "writes; stop it first")
        return
    if out.is_dir() and any(p.name != WRITER_LOCK for p in out.iterdir()):
        fail(f"--out {out} is a non-empty directory that is not a hippo-gpu index; give a new "
             "or empty directory")
    parent = next(p for p in (out, *out.parents) if p.exists())  # the root always exists
    if not parent.is_dir():
        fail(f"--out {out}: {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        fail(f"--out {out}: {parent} is not writable")


def corpus(
    folder: Path = typer.Argument(..., help="folder of .txt / .md files (recursively)"),
    out: Path = typer.Option(..., help="corpus JSON to write: list of {title, text}"),
    max_chars: int = typer.Option(1200, min=1, help="characters per passage at most"),
    overlap: int = typer.Option(0, min=0, help="characters a passage repeats from the one "
                                                "before (HippoRAG passages: 0)"),
    replace: bool = typer.Option(False, "--replace", help="overwrite an existing --out"),
) -> None:
    """Make a corpus file from a folder of text files: each split into passages by
    semantic-text-splitter, titled by its relative path; then extract and index that file."""
    from hippo_gpu.folder_corpus import folder_corpus
    from hippo_gpu.storage.durable import write_atomic

    if out.exists() and (out.is_dir() or not replace):
        fail(f"--out {out} already exists" + ("" if out.is_dir() else "; pass --replace to "
                                              "overwrite it"))
    try:
        made = folder_corpus(folder, max_chars=max_chars, overlap=overlap)
    except ValueError as e:
        fail(str(e))
    if not made.passages:
        fail(f"{folder}: its {made.files} text file(s) hold no text")
    try:
        write_atomic(out, json.dumps(made.passages, ensure_ascii=False, indent=1) + "\n")
    except OSError as e:
        fail(f"--out {out}: {e.strerror or e}")
    console.print(f"{made.files} file(s) -> {len(made.passages)} passages -> {out}"
                  + (f"; skipped {len(made.empty)} empty: {', '.join(made.empty[:5])}"
                     + (" ..." if len(made.empty) > 5 else "") if made.empty else ""),
                  markup=False, highlight=False)


def index(
    corpus: Path = typer.Option(..., help="corpus JSON: list of {title, text}"),
    out: Path = typer.Option(..., help="index directory to write (atomically): a new or empty "
                                       "one, or an existing index with --replace"),
    replace: bool = typer.Option(
        False, "--replace", help="replace the index already in --out by this build (refused "
                                 "while a writer or a writable server holds it)"),
    openie: Path | None = typer.Option(None, help="OpenIE JSON (HippoRAG v1 or v2 format)"),
    llm: str | None = typer.Option(None, help="extract OpenIE first with this " + LLM_HELP),
    encoder: str = typer.Option(EncoderConfig.model, help=ENCODER_HELP),
    encoder_concurrency: int = typer.Option(
        RemoteEncoderConfig.concurrency, min=1,
        help="openai: encoder: embeddings requests in flight at once"),
    encoder_truncate_chars: int | None = typer.Option(
        None, min=1, help="openai: encoder: cut every text to its first N characters before "
                          "sending (default: send whole; a server that refuses a text as too "
                          "long stops the build with an error naming it)"),
    embeddings: Path | None = typer.Option(
        None, help="directory of precomputed vectors: {passages,phrases,facts}.npy + .json "
                   "(texts in row order); texts it lacks are encoded with --encoder"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    threads: int | None = typer.Option(None, help="CPU threads (torch and faiss)"),
    encoder_precision: str = typer.Option(
        "float32", help="encoder compute precision while indexing: float32 | bfloat16 "
                        "(bfloat16 changes the vectors, hence the synonym edges; measure first)"),
    knn_backend: str = typer.Option("auto", help="auto (exact below 50k phrases, else "
                                                 "ivf-join with held-out recall) | faiss-flat "
                                                 "| ivf-join | faiss-hnsw | faiss-ivf | "
                                                 "faiss-gpu | torch"),
    allow_missing_openie: bool = typer.Option(
        False, help="index corpus passages the OpenIE file lacks, without triples"),
    cache_dir: Path | None = typer.Option(None, help="embedding cache (default: "
                                                        "$HIPPO_GPU_CACHE/embeddings)"),
    ppr_basis: bool = typer.Option(
        True, "--ppr-basis/--no-ppr-basis",
        help="solve and store the passage basis (D + 1 PPR solves per build and commit; "
             "HippoRAG 2 queries then skip most of their PPR)"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Build an index from a corpus and its OpenIE output (or extract it with --llm first)."""
    _check_out(out, replace)  # before any work: a refusal costs nothing and leaves nothing
    from hippo_gpu.indexing.build import build_index

    n = setup(threads, verbose)
    try:
        remote = RemoteEncoderConfig(concurrency=encoder_concurrency,
                                     truncate_chars=encoder_truncate_chars) \
            if encoder.startswith("openai:") else None
        encoder_config = EncoderConfig(model=encoder, precision=encoder_precision, remote=remote)
    except ValueError as e:
        fail(str(e))
    passages = _passages(corpus, openie, llm)
    if llm is None:
        assert openie is not None  # _passages checked that exactly one is given
        openie_path = openie
    else:  # the build reads its OpenIE from the file, kept beside the index
        openie_path = out.parent / f"{out.name}.openie.json"
        _extract(passages, llm, openie_path)
    try:
        idx = build_index(
            passages, openie_path, out,
            encoder=encoder_config,
            device=device, graph=GraphConfig(knn_backend=knn_backend),
            cache_dir=cache_dir or cache_root() / "embeddings",
            allow_missing_openie=allow_missing_openie, show_progress=True,
            embeddings=embeddings, ppr_basis=ppr_basis,
        )
    except ValueError as e:
        fail(str(e))
    console.print(timing_table(idx.timings, f"index built in {out} ({n} threads)"))
    console.print_json(json.dumps(idx.stats()))


def stats(path: Path = typer.Argument(..., help="index directory"),
          as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Print an index's counts (upstream graph_info definitions), read from its manifest."""
    from hippo_gpu.storage.directory import manifest_stats, read_manifest

    s = manifest_stats(read_manifest(path))
    if s is None:  # a manifest from before the basis summary: the counts of a loaded index
        from hippo_gpu.versions.load import load_index

        s = load_index(path, device="cpu").stats()
    if as_json:
        print(json.dumps(s))
        return
    table = Table(title=str(path))
    table.add_column("count")
    table.add_column("value", justify="right")
    for k, v in s.items():
        table.add_row(k, str(v))
    console.print(table)


def _change_table(report, title: str) -> Table:
    table = Table(title=title)
    table.add_column("change")
    table.add_column("count", justify="right")
    for k, v in report.as_dict().items():
        if k not in ("stage_seconds", "version"):
            table.add_row(k, str(v))
    return table


def insert(
    path: Path = typer.Argument(..., help="index directory"),
    corpus: Path = typer.Option(..., help="corpus JSON of the passages to add"),
    openie: Path | None = typer.Option(None, help="their OpenIE JSON (v1 or v2 format)"),
    llm: str | None = typer.Option(None, help="extract their OpenIE first with this " + LLM_HELP),
    openie_out: Path | None = typer.Option(
        None, help="with --llm: also write the extracted OpenIE JSON (v2) to this file "
                   "(default: none; the writer takes the extracted docs as they are)"),
    allow_missing_openie: bool = typer.Option(
        False, help="insert passages the --openie file lacks, without triples (as `index` "
                    "does with this option)"),
    device: str = typer.Option("auto", help="auto | cpu | cuda (encoding, kNN)"),
    threads: int | None = typer.Option(None, help="CPU threads (torch and faiss)"),
    cache_dir: Path | None = typer.Option(None, help="embedding cache (default: "
                                                        "$HIPPO_GPU_CACHE/embeddings)"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Add passages to an index: one atomic commit, equal to a rebuild of the new corpus."""
    from hippo_gpu.versions.writer import IndexWriter

    n = setup(threads, verbose)
    if openie_out is not None and llm is None:
        fail("--openie-out needs --llm (it names where the extracted OpenIE goes)")
    if allow_missing_openie and openie is None:
        fail("--allow-missing-openie needs --openie (an extraction covers every passage)")
    passages = _passages(corpus, openie, llm)
    docs = _extract(passages, llm, openie_out) if llm is not None else None
    if allow_missing_openie:  # the writer's insert reads a file that must cover the passages
        from hippo_gpu.data import read_openie

        assert openie is not None
        docs, _report = read_openie(openie, passages, allow_missing=True)
    try:
        with IndexWriter(path, device=device, show_progress=True, verify=False,
                         cache_dir=cache_dir or cache_root() / "embeddings") as w:
            if docs is None:
                assert openie is not None  # _passages checked that exactly one is given
                added = w.insert(passages, openie)
            else:  # extracted, or read with missing passages allowed: staged as they are
                added = w.insert_docs(passages, docs)
            if not added:
                console.print(f"nothing to insert: all {len(passages)} passage(s) are present")
                return
            w.commit()
            report = w.last_change
    except (OSError, KeyError) as e:
        fail(str(e))
    console.print(_change_table(report, f"inserted into {path} (version {report.version})"))
    console.print(timing_table(report.stage_seconds, f"stages ({n} threads)"))


def delete(
    path: Path = typer.Argument(..., help="index directory"),
    keys: Path | None = typer.Option(None, help='file with one passage key ("chunk-<md5>") '
                                                "per line"),
    titles: Path | None = typer.Option(None, help="file with one passage title per line "
                                                  "(every passage with that title goes)"),
    ids: Path | None = typer.Option(None, help="file with one passage id (the corpus items' "
                                               '"id") per line'),
    threads: int | None = typer.Option(None, help="CPU threads (torch and faiss)"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Remove passages from an index: one atomic commit, equal to a rebuild without them."""
    from hippo_gpu.versions.writer import IndexWriter

    n = setup(threads, verbose)
    given = [(name, f) for name, f in (("keys", keys), ("titles", titles), ("ids", ids))
             if f is not None]
    if len(given) != 1:
        fail("give exactly one of --keys FILE, --titles FILE or --ids FILE")
    what, source = given[0]
    try:
        lines = [ln.strip() for ln in source.read_text(encoding="utf-8").splitlines()]
        lines = [ln for ln in lines if ln]
        if not lines:
            fail(f"{source}: no {what} in the file")
        with IndexWriter(path, device="cpu", verify=False) as w:
            if what == "keys":
                w.delete(lines)
            elif what == "ids":
                w.delete_ids(lines)
            else:
                w.delete_titles(lines)
            w.commit()
            report = w.last_change
    except KeyError as e:
        fail(str(e.args[0]) if e.args else str(e))
    except OSError as e:
        fail(str(e))
    console.print(_change_table(report, f"deleted from {path} (version {report.version})"))
    console.print(timing_table(report.stage_seconds, f"stages ({n} threads)"))


def compact(path: Path = typer.Argument(..., help="index directory"),
            device: str = typer.Option("auto", help="where the basis solve runs")) -> None:
    """Fold the commits' segments into a new base (with the PPR basis solved) and remove old
    versions no reader holds and a killed writer's leftovers."""
    from hippo_gpu.storage.directory import is_index_dir
    from hippo_gpu.versions.compaction import compaction_due
    from hippo_gpu.versions.writer import IndexWriter

    if not is_index_dir(path):
        fail(f"{path} is not a hippo-gpu index")
    try:
        with IndexWriter(path, device=device, compact_after=None) as w:
            removed = w.garbage
            segments = len(w.manifest.get("segments", []))
            # asked for: any segment is due, and so is a basis the config keeps but lacks
            if compaction_due(w.manifest, w.index, max_segments=1):
                w.compact()
                console.print(f"compacted {segments} segment(s) into base version "
                              f"{w.index.version}")
                console.print(timing_table(w.last_compaction, "compaction stages"))
    except OSError as e:
        fail(str(e))
    console.print(f"removed {len(removed)}: {', '.join(removed) or 'nothing'}")


def register(app: typer.Typer) -> None:
    app.command()(corpus)
    app.command()(index)
    app.command()(stats)
    app.command()(insert)
    app.command()(delete)
    app.command()(compact)
