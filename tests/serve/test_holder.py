"""A read-only server follows the versions other processes commit (hippo_gpu/serve/holder.py,
`SearcherHolder.follow`) and names the version that answered: after a `hippo-gpu insert` it answers
from the new version within 2 s, equal to a fresh load of it; a switch never goes back to an older
version."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from hippo_gpu import Searcher, build_index, load_index
from hippo_gpu.cli import app
from hippo_gpu.sample import paths
from hippo_gpu.serve.holder import SearcherHolder
from hippo_gpu.serve.server import ServerConfig
from tests.serve.helpers import serve_cli, serving

ROOT = Path(__file__).resolve().parents[2]
FOLLOWED_WITHIN = 2.0  # seconds from the insert's exit to an answer from the new version


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample less its last passage, indexed with the weightless hash:32 encoder."""
    corpus = json.loads(paths()["corpus"].read_text())
    out = tmp_path_factory.mktemp("follow") / "index"
    build_index(corpus[:-1], paths()["openie"], out, encoder="hash:32", device="cpu")
    return out


@pytest.fixture()
def index_dir(built: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(built, tmp_path / "index"))


def _insert_last(index_dir: Path, tmp_path: Path) -> None:
    """`hippo-gpu insert` of the sample's last passage (a commit by another writer)."""
    corpus = json.loads(paths()["corpus"].read_text())
    passage = tmp_path / "last.json"
    passage.write_text(json.dumps(corpus[-1:]))
    res = CliRunner().invoke(app, ["insert", str(index_dir), "--corpus", str(passage),
                                   "--openie", str(paths()["openie"]), "--device", "cpu",
                                   "--threads", "1", "--cache-dir", str(tmp_path / "cache")])
    assert res.exit_code == 0, res.output


def _query() -> dict:
    """A retrieve request for the sample's last passage, by its own text."""
    last = json.loads(paths()["corpus"].read_text())[-1]
    return {"queries": [last["text"]], "top_k": 3, "mode": "dense"}


def _until_version(client: httpx.Client, version: int) -> tuple[dict, float]:
    """Retrieve until the answer names `version`: (that answer, seconds it took)."""
    started = time.monotonic()
    while True:
        body = client.post("/v1/retrieve", json=_query()).json()
        waited = time.monotonic() - started
        if body["version"] == version or waited > 3 * FOLLOWED_WITHIN:
            return body, waited
        time.sleep(0.02)


def test_a_read_only_server_follows_a_cli_insert(index_dir: Path, tmp_path: Path) -> None:
    """A real `hippo-gpu serve --index DIR` (no --writable): the answer after the insert comes
    from the new version, names it, and holds the inserted passage first."""
    last = json.loads(paths()["corpus"].read_text())[-1]
    with serve_cli(index_dir) as url, httpx.Client(base_url=url, timeout=60) as c:
        before = c.post("/v1/retrieve", json=_query()).json()
        assert before["version"] == 1
        assert last["title"] not in [h["title"] for h in before["results"][0]]
        _insert_last(index_dir, tmp_path)
        after, waited = _until_version(c, 2)
        assert after["version"] == 2, f"still answering version {after['version']}"
        assert waited < FOLLOWED_WITHIN, f"followed after {waited:.2f} s"
        assert after["results"][0][0]["title"] == last["title"]
        assert c.get("/v1/indexes").json()["indexes"][0]["version"] == 2


def test_the_followed_version_equals_a_fresh_load(index_dir: Path, tmp_path: Path) -> None:
    """In process: the holder moves by replaying the new segment; its answers equal those of a
    searcher over a fresh load of the new version, and it keeps one version in memory."""
    holder = SearcherHolder(Searcher(load_index(index_dir, device="cpu")))
    holder.follow(0.05)
    try:
        with serving(holder, ServerConfig()) as (url, _), \
                httpx.Client(base_url=url, timeout=60) as c:
            _insert_last(index_dir, tmp_path)
            after, _ = _until_version(c, 2)
            assert after["version"] == 2
        fresh = Searcher(load_index(index_dir, device="cpu"))
        assert holder.current.index.passage_keys == fresh.index.passage_keys
        q = _query()["queries"]
        got = holder.current.rank(q, top_k=5, mode="hipporag2")
        want = fresh.rank(q, top_k=5, mode="hipporag2")
        assert got.passage_rows.tolist() == want.passage_rows.tolist()
        assert holder.versions_in_memory == 1
    finally:
        holder.close()


def test_a_switch_never_goes_back(index_dir: Path, tmp_path: Path) -> None:
    """A follower's refresh that a writer's commit overtook is dropped, not served."""
    old = load_index(index_dir, device="cpu")
    _insert_last(index_dir, tmp_path)
    holder = SearcherHolder(Searcher(load_index(index_dir, device="cpu")))
    holder.switch(old)
    assert holder.current.index.version == 2
