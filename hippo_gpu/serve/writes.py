"""Writes over HTTP: POST /v1/passages and DELETE /v1/passages through the index's one writer.

Readers never wait for a writer and never see a mix: the server answers each batch with the
`Searcher` it finds in `SearcherHolder.current` when the batch starts, and a write replaces that
reference only after its commit, with a searcher over the new version (reusing the query
encoder). Writes are serialised (one at a time per process; the index's flock also keeps out
writers in other processes) and run on a worker thread, so queries keep being answered during a
write. These routes exist only when the server has a token and an index directory to write.

With several indexes, a request's optional "index" names the one to change (default: the server's
default index, the first); an index served without a directory is read-only (409), an unknown name
is 404. Each index has its own holder and writer lock, so a write switches only its own queries.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from hippo_gpu.data import DataFormatError, Passage
from hippo_gpu.index import load_index
from hippo_gpu.search import Searcher
from hippo_gpu.store import WriterLockedError
from hippo_gpu.writer import IndexWriter

__all__ = ["DeleteRequest", "InsertRequest", "SearcherHolder", "write_router"]


class SearcherHolder:
    """The searcher queries use now; replaced atomically after each committed write."""

    def __init__(self, searcher: Searcher, index_dir: str | Path | None = None,
                 device: str = "auto", llm: str | None = None,
                 llm_cache: str | Path | None = None) -> None:
        self._searcher = searcher
        self.index_dir = Path(index_dir) if index_dir is not None else None
        self.device = device
        self.llm = llm  # OpenIE for passages posted without triples
        self.llm_cache = llm_cache
        self._write_lock = threading.Lock()

    @property
    def current(self) -> Searcher:
        return self._searcher

    def write(self, apply: Any) -> dict[str, Any]:
        """Run `apply(writer)` in one IndexWriter session, commit, and switch readers to the
        new version. Serialised; raises what the writer raises (nothing changes then)."""
        if self.index_dir is None:
            raise RuntimeError("this server has no index directory to write")
        with self._write_lock:
            old = self._searcher
            with IndexWriter(self.index_dir, device=self.device) as w:
                changed = apply(w)
                if not w.pending:
                    return {"changed": False, "skipped_present": changed,
                            "version": old.index.version}
                report = w.commit()
            index = load_index(self.index_dir, device=old.device, precision=old.index.precision)
            self._searcher = Searcher(index, old.config,
                                      query_precision=old.encoder_config.precision,
                                      query_batch_size=old.encoder_config.query_batch_size,
                                      encoder=old.encoder)
        return {"changed": True, **report.as_dict()}


class PassageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = Field(max_length=1_000, description="passage title")
    text: str = Field(min_length=1, max_length=100_000, description="passage body")
    triples: list[list[str]] | None = Field(
        default=None, max_length=1_000,
        description="OpenIE triples [subject, predicate, object] of this passage; omit them "
                    "to have the server extract them (only when it runs with --llm)")
    entities: list[str] = Field(default_factory=list, max_length=1_000,
                                description="named entities (kept with the OpenIE record)")


_INDEX_FIELD = Field(default=None, max_length=64,
                     description="the served index to change (default: the server's first)")


class InsertRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    passages: list[PassageIn] = Field(min_length=1, max_length=10_000)
    index: str | None = _INDEX_FIELD


class DeleteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keys: list[str] = Field(min_length=1, max_length=100_000,
                            description='passage keys "chunk-<md5>" to remove')
    index: str | None = _INDEX_FIELD


def _openie_of(passages: list[PassageIn], holder: SearcherHolder) -> dict[str, Any]:
    """OpenIE docs of the posted passages: their own triples, else the server's LLM's."""
    missing = [p for p in passages if p.triples is None]
    extracted: dict[str, dict[str, Any]] = {}
    if missing:
        if holder.llm is None:
            raise DataFormatError(
                f"{len(missing)} passage(s) without 'triples', and this server has no --llm to "
                "extract them")
        import json
        import tempfile

        from hippo_gpu.llm.extract import extract_openie

        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "openie.json"
            extract_openie([{"title": p.title, "text": p.text} for p in missing], holder.llm,
                           out, cache_path=holder.llm_cache, show_progress=False)
            for d in json.loads(out.read_text())["docs"]:
                extracted[d["idx"]] = d
    docs = []
    for p in passages:
        content = Passage(title=p.title, text=p.text)
        if p.triples is None:
            docs.append(extracted[content.key])
        else:
            docs.append({"idx": content.key, "passage": content.content,
                         "extracted_entities": p.entities, "extracted_triples": p.triples})
    return {"docs": docs}


def write_router(holders: SearcherHolder | Mapping[str, SearcherHolder], auth: Any,
                 auth_responses: dict[int | str, dict[str, Any]]) -> APIRouter:
    """The write routes over `holders` (name -> holder; the first is the default; one holder
    alone is served as "default"); `auth` is the server's bearer-token dependency (required)."""
    by_name = dict(holders) if isinstance(holders, Mapping) else {"default": holders}
    default = next(iter(by_name))
    router = APIRouter()
    responses: dict[int | str, dict[str, Any]] = {
        **auth_responses,
        404: {"description": "a key to delete is not in the index, or the named index is not "
                             "served (nothing changed)"},
        409: {"description": "another process holds the index's writer lock, or the index is "
                             "served read-only (no index directory)"},
        422: {"description": "malformed passages or triples (nothing changed)"},
    }

    def holder_of(name: str | None) -> SearcherHolder:
        name = default if name is None else name
        if name not in by_name:
            shown = repr(name if len(name) <= 64 else name[:64] + "...")
            raise HTTPException(404, f"unknown index {shown}: this server serves "
                                     f"{', '.join(repr(n) for n in by_name)}")
        if by_name[name].index_dir is None:
            raise HTTPException(409, f"index {name!r} is served read-only (no index directory)")
        return by_name[name]

    async def run(holder: SearcherHolder, apply: Any) -> dict[str, Any]:
        try:
            return await asyncio.to_thread(holder.write, apply)
        except WriterLockedError as e:
            raise HTTPException(409, str(e)) from e
        except KeyError as e:
            raise HTTPException(404, str(e.args[0]) if e.args else "unknown key") from e
        except DataFormatError as e:
            raise HTTPException(422, str(e)) from e

    @router.post("/v1/passages", operation_id="insert_passages", dependencies=[auth],
                 responses=responses,
                 summary="Add passages (with their triples); one atomic commit")
    async def insert_passages(req: InsertRequest) -> dict[str, Any]:
        holder = holder_of(req.index)
        passages = [{"title": p.title, "text": p.text} for p in req.passages]

        def apply(w: IndexWriter) -> int:
            return w.insert(passages, _openie_of(req.passages, holder))

        return await run(holder, apply)

    @router.delete("/v1/passages", operation_id="delete_passages", dependencies=[auth],
                   responses=responses,
                   summary="Remove passages by key; one atomic commit")
    async def delete_passages(req: DeleteRequest) -> dict[str, Any]:
        holder = holder_of(req.index)
        return await run(holder, lambda w: w.delete(req.keys))

    return router
