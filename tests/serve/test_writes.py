"""POST / DELETE /v1/passages on a live server: token required, atomic switch of the version the
queries see, errors that change nothing, and queries answered during writes from one version."""

from __future__ import annotations

import copy
import json
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from hippo_gpu import Searcher, build_index, load_index  # noqa: E402
from hippo_gpu.sample import paths  # noqa: E402
from hippo_gpu.serve.holder import SearcherHolder  # noqa: E402
from hippo_gpu.serve.server import ServerConfig, create_app  # noqa: E402
from hippo_gpu.serve.writes import WritableHolder  # noqa: E402
from tests.loopback import serve_asgi  # noqa: E402
from tests.storage.diskfull import FullDisk  # noqa: E402

TOKEN = "writes-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@contextmanager
def serving(app) -> Iterator[str]:
    with serve_asgi(app) as (url, _):
        yield url


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, sample_searcher):
    """The sample's first 25 passages saved, the other 5 with their triples, and a fresh build of
    all 30: built once per module (read-only; each test writes to its own copy of the index)."""
    files = paths()
    corpus = json.loads(Path(files["corpus"]).read_text())
    openie = json.loads(Path(files["openie"]).read_text())
    base = tmp_path_factory.mktemp("writes") / "idx"
    build_index(corpus[:25], openie, base, device="cpu", encoder=sample_searcher.encoder)
    by_passage = {d["passage"]: d for d in openie["docs"]}
    new = [{"title": p["title"], "text": p["text"],
            "triples": by_passage[f"{p['title']}\n{p['text']}"]["extracted_triples"]}
           for p in corpus[25:]]
    full = build_index(corpus, openie, None, device="cpu", encoder=sample_searcher.encoder)
    return base, new, full


@pytest.fixture()
def setup(tmp_path: Path, built, sample_searcher):
    base, new, full = built
    index_dir = shutil.copytree(base, tmp_path / "idx")
    searcher = Searcher(load_index(index_dir, device="cpu"), encoder=sample_searcher.encoder)
    holder = WritableHolder(searcher, index_dir, device="cpu", compact_quiet=None)
    return holder, copy.deepcopy(new), full, index_dir


def test_insert_and_delete_switch_queries_atomically(setup) -> None:
    holder, new, full, index_dir = setup
    app = create_app(holder, ServerConfig(token=TOKEN))
    spec_ops = None
    with serving(app) as url, httpx.Client(base_url=url, timeout=120) as c:
        spec_ops = {op["operationId"] for path in c.get("/openapi.json").json()["paths"].values()
                    for op in path.values()}
        assert {"insert_passages", "delete_passages"} <= spec_ops
        assert c.post("/v1/passages", json={"passages": new}).status_code == 401
        versions = {25: set(holder.current.index.passage_keys)}
        errors: list[str] = []
        stop = threading.Event()

        def reader() -> None:  # every answer must come from exactly one version
            while not stop.is_set():
                r = c.post("/v1/retrieve", headers=AUTH,
                           json={"queries": ["Who designed the lighthouse on Skerrow?"] * 3,
                                 "top_k": 30, "mode": "hipporag2"})
                if r.status_code != 200:
                    errors.append(r.text)
                    continue
                keys = [{h["key"] for h in hits} for hits in r.json()["results"]]
                if not any(all(k <= v for k in keys) for v in versions.values()):
                    errors.append("an answer mixes versions")

        threads = [threading.Thread(target=reader) for _ in range(2)]
        for t in threads:
            t.start()
        r = c.post("/v1/passages", headers=AUTH, json={"passages": new})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["passages_added"] == 5 and body["changed"]
        versions[30] = set(full.passage_keys)
        assert set(holder.current.index.passage_keys) == set(full.passage_keys)
        again = c.post("/v1/passages", headers=AUTH, json={"passages": new})
        assert again.status_code == 200 and again.json()["changed"] is False  # no-op
        gone = full.passage_keys[25:]
        bad = c.request("DELETE", "/v1/passages", headers=AUTH,
                        json={"keys": [gone[0], "chunk-unknown"]})
        assert bad.status_code == 404 and "chunk-unknown" in bad.text
        assert len(holder.current.index.passage_keys) == 30  # nothing changed
        r = c.request("DELETE", "/v1/passages", headers=AUTH, json={"keys": gone})
        assert r.status_code == 200 and r.json()["passages_removed"] == 5
        stop.set()
        for t in threads:
            t.join(60)
        assert errors == []
        assert len(holder.current.index.passage_keys) == 25
    # the served version is the committed one, equal to a fresh build's counts
    assert load_index(index_dir, device="cpu").stats() == holder.current.index.stats()


def test_writes_need_a_token_and_a_writable_index(setup, sample_searcher) -> None:
    holder, new, _, _ = setup
    for app in (create_app(holder, ServerConfig()),  # no token: no write routes at all
                create_app(sample_searcher, ServerConfig(token=TOKEN))):  # nothing to write
        with serving(app) as url, httpx.Client(base_url=url, timeout=60) as c:
            ops = {op["operationId"] for path in c.get("/openapi.json").json()["paths"].values()
                   for op in path.values()}
            assert "insert_passages" not in ops
            r = c.post("/v1/passages", headers=AUTH, json={"passages": new})
            assert r.status_code in (404, 405)


def test_passages_without_triples_need_an_llm(setup) -> None:
    holder, new, _, _ = setup
    with serving(create_app(holder, ServerConfig(token=TOKEN))) as url:
        body = {"passages": [{"title": new[0]["title"], "text": new[0]["text"]}]}
        r = httpx.post(url + "/v1/passages", headers=AUTH, json=body, timeout=60)
        assert r.status_code == 422 and "--llm" in r.text
        assert len(holder.current.index.passage_keys) == 25


def test_writes_go_to_the_named_index(setup, sample_searcher) -> None:
    """Two indexes in one server: a write names its index and changes only that one."""
    holder, new, full, _ = setup
    other = SearcherHolder(sample_searcher)  # served read-only: no index directory
    app = create_app({"live": holder, "ref": other}, ServerConfig(token=TOKEN))
    ref_keys = list(sample_searcher.index.passage_keys)
    with serving(app) as url, httpx.Client(base_url=url, timeout=120) as c:
        r = c.post("/v1/passages", headers=AUTH, json={"passages": new, "index": "ref"})
        assert r.status_code == 409 and "'ref' is served read-only" in r.text
        r = c.post("/v1/passages", headers=AUTH, json={"passages": new, "index": "nope"})
        assert r.status_code == 404 and "unknown index 'nope'" in r.text
        assert len(holder.current.index.passage_keys) == 25  # nothing changed
        r = c.post("/v1/passages", headers=AUTH, json={"passages": new, "index": "live"})
        assert r.status_code == 200 and r.json()["passages_added"] == 5, r.text
        listed = {i["name"]: i for i in c.get("/v1/indexes", headers=AUTH).json()["indexes"]}
        assert listed["live"]["passages"] == 30 and listed["ref"]["passages"] == 30
        assert listed["live"]["version"] == holder.current.index.version
        # queries to "live" see the new version; "ref" is untouched
        q = {"queries": ["Who designed the lighthouse on Skerrow?"], "top_k": 30}
        live = c.post("/v1/retrieve", headers=AUTH, json={**q, "index": "live"}).json()
        assert {h["key"] for h in live["results"][0]} == set(full.passage_keys)
        r = c.request("DELETE", "/v1/passages", headers=AUTH,
                      json={"keys": full.passage_keys[25:]})  # no index named: the first
        assert r.status_code == 200 and r.json()["passages_removed"] == 5
    assert len(holder.current.index.passage_keys) == 25
    assert list(other.current.index.passage_keys) == ref_keys


def test_a_write_reads_the_index_at_most_once(setup, sample_searcher, monkeypatch) -> None:
    """Each write request reads the index from disk at most once (the holder's one writer reads
    it on its first write, later writes build on the Index it committed), and the answers
    served after the writes equal a fresh build's."""
    import hippo_gpu.versions.load as versions_module

    holder, new, full, index_dir = setup
    reads: list[Path] = []
    real_read = versions_module.read_index_dir
    monkeypatch.setattr(versions_module, "read_index_dir",
                        lambda path, **kw: reads.append(Path(path)) or real_read(path, **kw))
    queries = ["Who designed the lighthouse on Skerrow?", "Where is the observatory?"]
    per_request = []
    with serving(create_app(holder, ServerConfig(token=TOKEN))) as url, \
            httpx.Client(base_url=url, timeout=120) as c:
        for method, body in (("POST", {"passages": new[:2]}), ("POST", {"passages": new[2:]}),
                             ("POST", {"passages": new}),  # all present: a no-op
                             ("DELETE", {"keys": full.passage_keys[:1]}),
                             ("POST", {"passages": [{"title": full.passage_titles[0],
                                                     "text": full.passage_texts[0].split(
                                                         "\n", 1)[1], "triples": []}]})):
            before = len(reads)
            r = c.request(method, "/v1/passages", headers=AUTH, json=body)
            assert r.status_code == 200, r.text
            per_request.append(len(reads) - before)
            if len(per_request) == 2:  # the full corpus: compare with the fresh build
                served = c.post("/v1/retrieve", headers=AUTH,
                                json={"queries": queries, "top_k": 30, "mode": "hipporag2"})
                assert served.status_code == 200, served.text
                assert holder.current.index.version == 3
                assert list(holder.current.index.passage_keys) == list(full.passage_keys)
    assert per_request == [1, 0, 0, 0, 0], per_request
    want = Searcher(full, encoder=sample_searcher.encoder).retrieve(queries, top_k=30,
                                                                    mode="hipporag2")
    for got_hits, want_hits in zip(served.json()["results"], want):
        got_scores = {h["key"]: h["score"] for h in got_hits}
        assert got_scores.keys() == {h.key for h in want_hits}
        for h in want_hits:  # every passage's score: no ranking tie can hide a difference
            assert abs(got_scores[h.key] - h.score) <= 1e-5, h.key
    # the last write re-added the deleted passage (without triples): what a reload serves
    assert load_index(index_dir, device="cpu").stats() == holder.current.index.stats()


def test_a_write_brings_the_basis_current_in_the_background(setup, sample_searcher) -> None:
    """After each write a background thread updates the served version's passage basis from
    the last one (versions/live_basis.py) and switches queries to it without a compaction: the
    served version has a basis again, stored with its segment (a new reader reads it), two writes
    in a row fold into the updates, and hipporag2 answers as a fresh build's (every score)."""
    holder, new, full, index_dir = setup
    queries = ["Who designed the lighthouse on Skerrow?", "Where is the observatory?"]
    with serving(create_app(holder, ServerConfig(token=TOKEN))) as url, \
            httpx.Client(base_url=url, timeout=120) as c:
        for rows in (new[:2], new[2:]):
            r = c.post("/v1/passages", headers=AUTH, json={"passages": rows})
            assert r.status_code == 200, r.text
        holder.wait_for_basis_update(120)
        assert holder.update_error is None and holder.basis_updates >= 1
        served = holder.current.index
        assert served.version == r.json()["version"] and served.basis is not None
        assert served.basis.updates >= 1
        got = c.post("/v1/retrieve", headers=AUTH,
                     json={"queries": queries, "top_k": 30, "mode": "hipporag2"})
        assert got.status_code == 200, got.text
    assert json.loads((index_dir / "manifest.json").read_text())["segments"]  # no compaction
    assert (index_dir / f"s{served.version:06d}" / "basis.json").exists()
    reader = load_index(index_dir, device="cpu")
    assert reader.basis is not None and reader.basis.updates == served.basis.updates
    assert reader.basis.z.equal(served.basis.z.cpu())
    want = Searcher(full, encoder=sample_searcher.encoder).retrieve(queries, top_k=30,
                                                                    mode="hipporag2")
    for got_hits, want_hits in zip(got.json()["results"], want):
        got_scores = {h["key"]: h["score"] for h in got_hits}
        assert got_scores.keys() == {h.key for h in want_hits}
        for h in want_hits:
            assert abs(got_scores[h.key] - h.score) <= 1e-5, h.key


def test_a_quiet_server_compacts_in_the_background(setup, monkeypatch) -> None:
    """Once writes pause, a holder whose chain is due by the policy (here after 1 segment)
    compacts in the background: a new base on disk, its basis solved and served, the same
    answers, and queries answered throughout."""
    import hippo_gpu.serve.writes as writes

    holder, new, full, index_dir = setup
    monkeypatch.setattr(writes, "COMPACT_AFTER", 1)
    holder.compact_quiet = 0.2
    queries = ["Who designed the lighthouse on Skerrow?"]
    with serving(create_app(holder, ServerConfig(token=TOKEN))) as url, \
            httpx.Client(base_url=url, timeout=120) as c:
        r = c.post("/v1/passages", headers=AUTH, json={"passages": new})
        assert r.status_code == 200, r.text
        before = c.post("/v1/retrieve", headers=AUTH,
                        json={"queries": queries, "top_k": 10, "mode": "hipporag2"}).json()
        holder.wait_for_compaction(60)
        assert holder.compactions == 1 and holder.compact_error is None
        served = holder.current.index
        assert served.basis is not None and served.version == r.json()["version"] + 1
        manifest = json.loads((index_dir / "manifest.json").read_text())
        assert manifest["segments"] == [] and manifest["base"] == f"v{served.version:06d}"
        after = c.post("/v1/retrieve", headers=AUTH,
                       json={"queries": queries, "top_k": 10, "mode": "hipporag2"}).json()
    got = [(h["key"], h["score"]) for h in after["results"][0]]
    want = [(h["key"], h["score"]) for h in before["results"][0]]
    assert [k for k, _ in got] == [k for k, _ in want]
    assert all(abs(a - b) <= 1e-5 for (_, a), (_, b) in zip(got, want))


def test_a_chain_due_by_the_policy_compacts_without_a_pause(setup, monkeypatch) -> None:
    """Under writes that never pause for `compact_quiet`, the holder still compacts once the
    chain reaches the writer's policy (here 3 segments): the chain does not grow without end."""
    import hippo_gpu.serve.writes as writes

    holder, new, _, index_dir = setup
    monkeypatch.setattr(writes, "COMPACT_AFTER", 3)
    holder.compact_quiet = 600.0  # a pause that never comes within this test
    with serving(create_app(holder, ServerConfig(token=TOKEN))) as url, \
            httpx.Client(base_url=url, timeout=120) as c:
        for p in new[:3]:
            r = c.post("/v1/passages", headers=AUTH, json={"passages": [p]})
            assert r.status_code == 200, r.text
        holder.wait_for_compaction(120)
    assert holder.compactions == 1 and holder.compact_error is None
    manifest = json.loads((index_dir / "manifest.json").read_text())
    assert manifest["segments"] == [] and holder.current.index.basis is not None


def test_writes_go_on_while_a_compaction_runs(setup, monkeypatch) -> None:
    """The background compaction solves the basis and writes its base without the write lock:
    a write made meanwhile commits at once, stays in the chain after the new base (nothing
    lost), and a second compaction follows once writes pause again."""
    import hippo_gpu.versions.writer as writer_module
    from hippo_gpu.data import OpenIEDoc, Passage

    holder, new, full, index_dir = setup
    entered, release = threading.Event(), threading.Event()
    real_solve = writer_module.solve_index_basis

    def slow_solve(*args, **kwargs):
        entered.set()
        assert release.wait(60)
        return real_solve(*args, **kwargs)

    import hippo_gpu.serve.writes as writes

    monkeypatch.setattr(writer_module, "solve_index_basis", slow_solve)
    monkeypatch.setattr(writes, "COMPACT_AFTER", 1)  # each segment makes the chain due
    holder.compact_quiet = 0.05

    def insert(rows):
        return holder.write(lambda w: w.insert_docs(
            [Passage(title=p["title"], text=p["text"]) for p in rows],
            [OpenIEDoc.from_raw([], p["triples"]) for p in rows]))

    first = insert(new[:2])
    assert entered.wait(60)  # the compaction of `first` is solving its basis
    t = time.perf_counter()
    second = insert(new[2:])  # does not wait for it
    assert time.perf_counter() - t < 30 and second["version"] == first["version"] + 1
    release.set()
    deadline = time.monotonic() + 120
    while holder.compactions < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    holder.wait_for_compaction(120)
    assert holder.compactions == 2 and holder.compact_error is None
    manifest = json.loads((index_dir / "manifest.json").read_text())
    assert manifest["segments"] == []
    served = holder.current.index
    assert served.basis is not None and list(served.passage_keys) == list(full.passage_keys)
    loaded = load_index(index_dir, device="cpu")
    assert loaded.stats() == served.stats() and loaded.version == served.version


def test_a_full_disk_answers_507_and_changes_nothing(setup) -> None:
    """A write request on a full disk (tests/storage/diskfull.py: every write under the index
    fails): 507 naming the cause, the index files and the served version unchanged; the same request
    succeeds once there is space."""
    holder, new, full, index_dir = setup

    def files() -> dict[str, bytes]:
        return {str(p): p.read_bytes() for p in index_dir.rglob("*")
                if p.is_file() and p.name != ".writer.lock"}

    before, version = files(), holder.current.index.version
    app = create_app(holder, ServerConfig(token=TOKEN))
    with serving(app) as url, httpx.Client(base_url=url, timeout=120) as c:
        with FullDisk(index_dir, fail_at=1) as disk:
            r = c.post("/v1/passages", headers=AUTH, json={"passages": new})
        assert r.status_code == 507, r.text
        assert any(op.startswith("mkdir .tmp-s") for op in disk.failed)  # the segment
        assert "no space left on device for the commit" in r.json()["detail"]
        assert files() == before and holder.current.index.version == version
        r = c.post("/v1/passages", headers=AUTH, json={"passages": new})
        assert r.status_code == 200, r.text
    assert holder.current.index.passage_keys == full.passage_keys


def test_an_oversized_request_is_answered_from_one_version(setup, monkeypatch) -> None:
    """A request split into chunks (more queries than max_batch) is answered, every chunk, by
    the version current when its batch started, and names it, though a write commits between
    its chunks."""
    import asyncio

    from hippo_gpu.data import OpenIEDoc, Passage
    from hippo_gpu.serve.batcher import BatcherConfig
    from hippo_gpu.serve.service import RetrievalService

    holder, new, _full, _ = setup
    first = holder.current
    before = first.index.version
    real = first.rank
    calls = []

    def rank_then_write(*args, **kwargs):
        out = real(*args, **kwargs)
        if not calls:  # after the first chunk: a write commits and switches the holder
            holder.write(lambda w: w.insert_docs([Passage(new[0]["title"], new[0]["text"])],
                                                 [OpenIEDoc.from_raw([], new[0]["triples"])]))
        calls.append(len(args[0]))
        return out

    monkeypatch.setattr(first, "rank", rank_then_write)
    service = RetrievalService({"default": holder}, BatcherConfig(max_batch=2, max_wait_ms=1))

    async def main():
        async with service:
            return await service.retrieve([f"query {i}" for i in range(5)], top_k=100,
                                          mode="dense")

    answers = asyncio.run(main())
    assert [a.version for a in answers] == [before] * 5
    assert calls == [2, 2, 1] and holder.current.index.version == before + 1
    assert all({h["key"] for h in a.hits} == set(first.index.passage_keys) for a in answers)
