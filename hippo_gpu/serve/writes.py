"""Writes over HTTP: POST /v1/passages and DELETE /v1/passages through the index's one writer.

A `WritableHolder` is the `SearcherHolder` (serve/holder.py) of an index this server changes:
it owns the index's one `IndexWriter` and switches its readers to the version each commit
computed (moved to the searcher's device; queries never wait and never see a mix). The writer
reads the index from disk on its first write and again only after another process changed it,
so a write request reads the index at most once (posted triples go in as `OpenIEDoc` objects,
LLM extraction hands back its docs: no OpenIE file is written or read). Writes are serialised
(one at a time per process; the index's flock also keeps out writers in other processes) and
run on a worker thread, so queries keep being answered during a write. These routes exist only
when the server has a token and an index directory to write.

With several indexes, a request's optional "index" names the one to change (default: the server's
default index, the first); an index served without a directory is read-only (409), an unknown name
is 404. Each index has its own holder and writer lock, so a write switches only its own queries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hippo_gpu.data import DataFormatError, OpenIEDoc, Passage, as_passages
from hippo_gpu.errors import DiskFullError
from hippo_gpu.retrieval.searcher import Searcher
from hippo_gpu.serve.holder import SearcherHolder
from hippo_gpu.serve.write_limits import WriteLimits
from hippo_gpu.storage.directory import collect_garbage
from hippo_gpu.storage.locks import WriterLockedError, claim_for_serving
from hippo_gpu.versions.compaction import COMPACT_AFTER, compaction_due
from hippo_gpu.versions.writer import IndexWriter

log = logging.getLogger(__name__)

__all__ = ["DeleteRequest", "InsertRequest", "WritableHolder", "write_router"]


COMPACT_QUIET_SECONDS = 5.0  # a holder compacts once no write came for this long


class WritableHolder(SearcherHolder):
    """The searcher holder of an index this server writes: replaced atomically after each
    committed write. Its one IndexWriter (made on the first write) keeps the last committed
    version in host memory (float32) between writes, so the next write reads nothing from disk.

    A commit writes a segment and serves a version without the passage basis (hippo_gpu.
    versions); a background thread then brings its basis current by a low-rank update from the
    last version that had one (versions/live_basis.py: seconds at 100k passages, not a full
    solve), stores it with the segment and switches queries to it (hipporag2 by linearity
    again); commits that land while it runs are folded into its next update. Once no write came
    for `compact_quiet` seconds (or at once when the chain is due by the writer's policy,
    `compaction_due`, under a stream that never pauses), another background thread compacts (a
    new base, its basis solved afresh) and switches queries to it; a missing basis makes a
    compaction due only when no update can bring it current. Queries never wait for either; a
    write that arrives during a switch waits for it. `compact_quiet` None: never compact here
    (`hippo-gpu compact` or a writer's policy does). After a compaction the old base and its
    segments are removed at once (directory.collect_garbage; one another process is reading
    stays until the next write).

    For its whole life the holder claims the directory (locks.claim_for_serving; `close`
    releases it): its writer holds the last version in memory and the writer lock only while it
    writes, so a build saved over the directory meanwhile (`hippo-gpu index --replace`) would be
    undone by the next write; the claim makes that save refuse instead.
    """

    index_dir: Path  # the directory this holder writes (a read-only holder has None)

    def __init__(self, searcher: Searcher, index_dir: str | Path, device: str = "auto",
                 llm: str | None = None, llm_cache: str | Path | None = None,
                 compact_quiet: float | None = COMPACT_QUIET_SECONDS) -> None:
        super().__init__(searcher)
        self.index_dir = Path(index_dir)
        self.device = device
        self.llm = llm  # OpenIE for passages posted without triples
        self.llm_cache = llm_cache
        self._write_lock = threading.Lock()
        self._writer: IndexWriter | None = None  # the one writer of index_dir, made on first use
        self.compact_quiet = compact_quiet
        self._compactor: threading.Thread | None = None
        self._updater: threading.Thread | None = None
        self._update_again = False  # a commit landed while an update ran: run once more
        self.basis_updates = 0  # background basis updates done
        self.update_error: str | None = None  # the last background update's failure
        self._last_write = 0.0
        self.compactions = 0  # background compactions done
        self.compact_error: str | None = None  # the last background compaction's failure
        self._claim = claim_for_serving(self.index_dir)  # released by close()

    def close(self) -> None:
        """Release the claim on the directory (a replace may then proceed) and stop following;
        writes still work."""
        super().close()
        self._claim.close()

    def write(self, apply: Any) -> dict[str, Any]:
        """Run `apply(writer)` in one IndexWriter session, commit, and switch readers to the
        new version. Serialised; raises what the writer raises (nothing changes then)."""
        with self._write_lock:
            if self._writer is None:
                self._writer = IndexWriter(self.index_dir, device=self.device,
                                           compact_after=None)
            with self._writer as w:  # the lock for this write only: other processes may write
                changed = apply(w)
                if not w.pending:
                    return {"changed": False, "skipped_present": changed,
                            "version": self.current.index.version}
                committed = w.commit()
                report = w.last_change
            self.switch(committed)
            self._last_write = time.monotonic()
            self._schedule_basis_update()
            self._schedule_compaction()
        return {"changed": True, **report.as_dict()}

    def _schedule_basis_update(self) -> None:
        """Called under the write lock after a commit."""
        if self._updater is not None and self._updater.is_alive():
            self._update_again = True  # the running update folds this commit next
            return
        self._update_again = False
        self._updater = threading.Thread(target=self._update_basis, daemon=True,
                                         name="hippo-gpu-basis")
        self._updater.start()

    def _update_basis(self) -> None:
        """Bring the held version's basis current (IndexWriter.prepare_basis_update outside the
        write lock, finish_basis_update under it) and switch queries to it; again while
        commits keep landing meanwhile (each update folds all commits since the last)."""
        while True:
            w = self._writer
            if w is None:
                return
            try:
                prepared = w.prepare_basis_update()  # seconds: writes go on meanwhile
                current = None
                with self._write_lock:
                    if prepared is not None:
                        current = w.finish_basis_update(prepared)
                        self.basis_updates += 1
                    again, self._update_again = self._update_again, False
                if current is not None:  # still the held version (unless a commit overtakes
                    self.switch(current, warm=True)  # it meanwhile): serve its basis, warmed
                if prepared is not None:  # after the switch: readers of other processes
                    w.store_basis_update(prepared)
                if not again:
                    w.warm_anchor_solver()  # the next update's, while no write waits
                    with self._write_lock:
                        if not self._update_again:
                            return
                        self._update_again = False
            except Exception as e:  # noqa: BLE001 - a failed update loses nothing: logged
                self.update_error = f"{type(e).__name__}: {e}"
                log.exception("background basis update of %s failed", self.index_dir)
                return

    def wait_for_basis_update(self, timeout: float | None = None) -> None:
        """Block until a scheduled background basis update has finished (tests, benchmarks)."""
        if self._updater is not None:
            self._updater.join(timeout)

    def _schedule_compaction(self) -> None:
        if self.compact_quiet is None or (self._compactor and self._compactor.is_alive()):
            return
        self._compactor = threading.Thread(target=self._compact_when_quiet, daemon=True,
                                           name="hippo-gpu-compact")
        self._compactor.start()

    def _compact_when_quiet(self) -> None:
        """Compact once writes pause, or at once when the chain is due by the writer's policy
        (`compaction_due`: COMPACT_AFTER segments, or segments over a quarter of the base: a
        stream that never pauses must not grow the chain without end). The policy reads the
        manifest the writer holds (its last commit wrote it), not the disk. The basis solve and
        the base write run outside the write lock (writes go on meanwhile), only the manifest
        switch takes it."""
        assert self.compact_quiet is not None
        while (wait := self._last_write + self.compact_quiet - time.monotonic()) > 0:
            if self._chain_due():
                break
            time.sleep(min(wait, 1.0))
        try:
            with self._write_lock:
                w = self._writer
                # due by the chain, or by the basis the held version lacks when no update
                # brings it current
                if w is None or not compaction_due(
                        w.manifest, None if w.updates_basis else w.index,
                        max_segments=COMPACT_AFTER):
                    return
            started = time.monotonic()
            prepared = w.prepare_compaction()  # minutes at a million passages: no lock held
            with self._write_lock:
                with w:
                    current = w.finish_compaction(prepared)
                    if current.basis is not None:  # no write came meanwhile: serve the basis
                        self.switch(current)
                    # the old base and its segments: removed now, not at the next write
                    w.garbage += collect_garbage(self.index_dir, w.manifest)
                self.compactions += 1
        except Exception as e:  # noqa: BLE001 - a failed compaction loses nothing: logged
            self.compact_error = f"{type(e).__name__}: {e}"
            log.exception("background compaction of %s failed", self.index_dir)
            return
        if self._last_write > started:  # writes came during it: again once they pause
            self._compactor = None
            self._schedule_compaction()

    def _chain_due(self) -> bool:
        """Whether the chain the writer holds is due (the basis alone waits for the pause:
        every commit leaves it stale)."""
        w = self._writer
        return w is not None and compaction_due(w.manifest, max_segments=COMPACT_AFTER)

    def wait_for_compaction(self, timeout: float | None = None) -> None:
        """Block until a scheduled background compaction has finished (tests, shutdown)."""
        if self._compactor is not None:
            self._compactor.join(timeout)


def write_models(limits: WriteLimits) -> tuple[type[BaseModel], type[BaseModel]]:
    """(InsertRequest, DeleteRequest): the write routes' bodies, with `limits` in their schema."""

    class PassageIn(BaseModel):
        model_config = ConfigDict(extra="forbid")

        title: str = Field(max_length=limits.max_title_chars, description="passage title")
        text: str = Field(min_length=1, max_length=limits.max_text_chars,
                          description="passage body")
        triples: list[list[str]] | None = Field(
            default=None, max_length=limits.max_triples_per_passage,
            description="OpenIE triples [subject, predicate, object] of this passage; omit "
                        "them to have the server extract them (only when it runs with --llm)")
        entities: list[str] = Field(default_factory=list,
                                    max_length=limits.max_entities_per_passage,
                                    description="named entities (kept with the OpenIE record)")
        id: str | None = Field(default=None, max_length=256,
                               description="the passage's own id, returned on its hits and "
                                           "usable to delete it; unique in the index")
        metadata: dict[str, Any] | None = Field(
            default=None, description="the passage's own metadata (a JSON object), returned on "
                                      'its hits and matched by a request\'s "where"')

    index_field = Field(default=None, max_length=64,
                        description="the served index to change (default: the server's first)")

    class InsertRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")

        passages: list[PassageIn] = Field(min_length=1,
                                          max_length=limits.max_passages_per_request)
        index: str | None = index_field

    class DeleteRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")

        keys: list[Annotated[str, Field(max_length=64)]] | None = Field(
            default=None, min_length=1, max_length=limits.max_keys_per_request,
            description='passage keys "chunk-<md5>" to remove (or give "ids")')
        ids: list[Annotated[str, Field(max_length=256)]] | None = Field(
            default=None, min_length=1, max_length=limits.max_keys_per_request,
            description="the passages' own ids to remove (or give \"keys\")")
        index: str | None = index_field

        @model_validator(mode="after")
        def one_of_keys_or_ids(self) -> DeleteRequest:
            if (self.keys is None) == (self.ids is None):
                raise ValueError("give exactly one of keys or ids")
            return self

    return InsertRequest, DeleteRequest


InsertRequest, DeleteRequest = write_models(WriteLimits())  # the default limits' bodies


def _docs_of(passages: list[Any], holder: WritableHolder) -> list[OpenIEDoc]:
    """OpenIE of the posted passages, in their order: their own triples, else the server's
    LLM's (extracted into the holder's LLM cache; no OpenIE file)."""
    contents = [Passage(title=p.title, text=p.text) for p in passages]
    missing = [c for c, p in zip(contents, passages) if p.triples is None]
    extracted: dict[str, OpenIEDoc] = {}
    if missing:
        if holder.llm is None:
            raise DataFormatError(
                f"{len(missing)} passage(s) without 'triples', and this server has no --llm to "
                "extract them")
        extracted = dict(zip((c.key for c in missing), _extract(missing, holder)))
    return [extracted[c.key] if p.triples is None else OpenIEDoc.from_raw(p.entities, p.triples)
            for c, p in zip(contents, passages)]


def _extract(passages: list[Passage], holder: WritableHolder) -> list[OpenIEDoc]:
    """The server LLM's OpenIE of `passages`; a holder without an LLM cache gets a temporary
    one (per request, as before)."""
    import tempfile

    from hippo_gpu.llm.extract import extract_openie

    assert holder.llm is not None
    with contextlib.ExitStack() as stack:
        cache = holder.llm_cache
        if cache is None:
            cache = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "llm.sqlite"
        return extract_openie(passages, holder.llm, None, cache_path=cache,
                              show_progress=False).docs


def write_router(holders: SearcherHolder | Mapping[str, SearcherHolder], auth: Any,
                 auth_responses: dict[int | str, dict[str, Any]],
                 limits: WriteLimits | None = None) -> APIRouter:
    """The write routes over `holders` (name -> holder; the first is the default; one holder
    alone is served as "default"); `auth` is the server's bearer-token dependency (required),
    `limits` the bodies' (default: WriteLimits())."""
    insert_model, delete_model = write_models(limits or WriteLimits())
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
        507: {"description": "the index's disk is full (nothing changed; the same request "
                             "succeeds once there is space)"},
    }

    def holder_of(name: str | None) -> WritableHolder:
        name = default if name is None else name
        if name not in by_name:
            shown = repr(name if len(name) <= 64 else name[:64] + "...")
            raise HTTPException(404, f"unknown index {shown}: this server serves "
                                     f"{', '.join(repr(n) for n in by_name)}")
        holder = by_name[name]
        if not isinstance(holder, WritableHolder):
            raise HTTPException(409, f"index {name!r} is served read-only (no index directory)")
        return holder

    async def run(holder: WritableHolder, apply: Any) -> dict[str, Any]:
        try:
            return await asyncio.to_thread(holder.write, apply)
        except WriterLockedError as e:
            raise HTTPException(409, str(e)) from e
        except KeyError as e:
            raise HTTPException(404, str(e.args[0]) if e.args else "unknown key") from e
        except DataFormatError as e:
            raise HTTPException(422, str(e)) from e
        except DiskFullError as e:
            raise HTTPException(507, str(e)) from e

    async def insert_passages(req: Any) -> dict[str, Any]:
        holder = holder_of(req.index)

        def apply(w: IndexWriter) -> int:
            passages = as_passages([{"title": p.title, "text": p.text, "id": p.id,
                                     "metadata": p.metadata} for p in req.passages])
            return w.insert_docs(passages, _docs_of(req.passages, holder))

        return await run(holder, apply)

    async def delete_passages(req: Any) -> dict[str, Any]:
        holder = holder_of(req.index)
        if req.ids is not None:
            return await run(holder, lambda w: w.delete_ids(req.ids))
        return await run(holder, lambda w: w.delete(req.keys))

    # The body models carry `limits`; FastAPI reads them from the annotations.
    insert_passages.__annotations__["req"] = insert_model
    delete_passages.__annotations__["req"] = delete_model
    router.post("/v1/passages", operation_id="insert_passages", dependencies=[auth],
                responses=responses,
                summary="Add passages (with their triples); one atomic commit")(insert_passages)
    router.delete("/v1/passages", operation_id="delete_passages", dependencies=[auth],
                  responses=responses,
                  summary="Remove passages by key or by their own id; one atomic "
                          "commit")(delete_passages)

    return router
