"""A corpus from a folder of text files: the step before OpenIE for users whose passages are
documents on disk rather than a JSON list.

What it does, in order:

1. Every ``.txt``, ``.md`` and ``.markdown`` file under the folder, recursively, in the order of
   its relative path (POSIX form, so the order is the same on every OS). Hidden files and files
   in hidden folders (a part starting with ".") are left out; so is anything else.
2. Each file is read as UTF-8 (a file that is not UTF-8 is refused by name, with the byte
   offset) and split into chunks of at most ``max_chars`` characters by semantic-text-splitter
   (a maintained Rust splitter): Markdown files along headings, blocks and sentences
   (``MarkdownSplitter``), other text along paragraphs, sentences and words (``TextSplitter``);
   a unit longer than ``max_chars`` is cut at the next smaller unit, so no chunk exceeds it.
   Chunks are trimmed; ``overlap`` characters of the previous chunk may repeat at the start of
   the next (default 0: HippoRAG passages do not overlap, and overlapping text would give the
   same triples to two passages).
3. Each chunk becomes a passage ``{"title", "text", "id", "metadata"}``: the title is the
   file's relative path, with ``(i/n)`` appended when the file gave n > 1 chunks; the id is
   ``path#i`` and the metadata ``{"path": path, "chunk": i, "chunks": n}`` (the passage's own
   labels, returned on its hits: ``where={"path": "notes/a.md"}`` keeps one file's chunks).
   Titles are unique, so passage keys (``title + "\\n" + text``, hippo_gpu.data.passage_key)
   are too. A file with no text is skipped and reported.

The result is an ordinary corpus: write it as JSON (``hippo-gpu corpus``) and give that file to
``extract``, ``index`` and ``insert``, so every later step reads the same passages. The folder
is chunked once, deliberately: a second chunking with other settings would give passages whose
keys no longer match their OpenIE.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUFFIXES = (".txt", ".md", ".markdown")
MARKDOWN = (".md", ".markdown")
DEFAULT_MAX_CHARS = 1200  # a few paragraphs: MuSiQue's passages are 400-800 characters


@dataclass
class FolderCorpus:
    """The passages of a folder and what was read to make them."""

    passages: list[dict[str, Any]]
    files: int  # text files read
    empty: list[str] = field(default_factory=list)  # relative paths of files with no text


def text_files(folder: Path) -> Iterator[tuple[str, Path]]:
    """(relative POSIX path, path) of each text file under `folder`, in relative-path order."""
    found = []
    for path in folder.rglob("*"):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts):
            continue
        if path.suffix.lower() in SUFFIXES and path.is_file():
            found.append((rel.as_posix(), path))
    yield from sorted(found)


def folder_corpus(folder: str | Path, *, max_chars: int = DEFAULT_MAX_CHARS,
                  overlap: int = 0) -> FolderCorpus:
    """The corpus of `folder` (module docstring): one passage per chunk of each text file.

    Raises ValueError naming the folder or file at fault: not a folder, no text file in it,
    a file that is not UTF-8, or chunk settings out of range.
    """
    from semantic_text_splitter import MarkdownSplitter, TextSplitter

    folder = Path(folder)
    if max_chars < 1:
        raise ValueError(f"max_chars must be at least 1, not {max_chars}")
    if not 0 <= overlap < max_chars:
        raise ValueError(f"overlap must be at least 0 and below max_chars ({max_chars}), "
                         f"not {overlap}")
    if not folder.is_dir():
        raise ValueError(f"{folder}: not a folder")
    markdown = MarkdownSplitter(max_chars, overlap=overlap)
    plain = TextSplitter(max_chars, overlap=overlap)
    out = FolderCorpus(passages=[], files=0)
    for rel, path in text_files(folder):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text (byte {e.start}); convert it or move it "
                             "out of the folder") from None
        out.files += 1
        splitter = markdown if path.suffix.lower() in MARKDOWN else plain
        chunks = [c.strip() for c in splitter.chunks(text.lstrip("\ufeff"))]
        chunks = [c for c in chunks if c]
        if not chunks:
            out.empty.append(rel)
            continue
        n = len(chunks)
        out.passages += [{"title": rel if n == 1 else f"{rel} ({i}/{n})", "text": c,
                          "id": f"{rel}#{i}", "metadata": {"path": rel, "chunk": i, "chunks": n}}
                         for i, c in enumerate(chunks, start=1)]
    if out.files == 0:
        raise ValueError(f"{folder}: no {', '.join(SUFFIXES)} file in it (hidden ones are "
                         "left out)")
    return out
