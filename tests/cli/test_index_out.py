"""`hippo-gpu index --out` destroys nothing by accident (hippo_gpu/cli/index.py, `_check_out`):
an existing index without --replace, an index a writer or a writable server holds (even with
--replace), a non-empty folder and a file are refused at once, before any build work (the
build is never called; in a fresh interpreter neither torch nor numpy is imported), with a
one-line message, nothing changed on disk and no lock left. --replace on an index nobody holds
builds a new version."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner, Result

from hippo_gpu import build_index, load_index
from hippo_gpu.cli import app
from hippo_gpu.sample import paths
from hippo_gpu.storage.directory import read_manifest
from hippo_gpu.storage.locks import holder_of, writer_lock
from tests.cli.helpers import run_app
from tests.serve.helpers import serve_cli

runner = CliRunner()
REFUSAL_SECONDS = 1.0  # from the CLI call to its exit, in this process (torch already loaded)
TOKEN = "index-out-test-token"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample corpus less its last passage, indexed with the weightless hash:32 encoder."""
    corpus = json.loads(paths()["corpus"].read_text())
    out = tmp_path_factory.mktemp("index_out") / "index"
    build_index(corpus[:-1], paths()["openie"], out, encoder="hash:32", device="cpu")
    return out


@pytest.fixture()
def index_dir(built: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(built, tmp_path / "index"))


@pytest.fixture()
def no_build(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The build, replaced by one that records a call (a refusal must never reach it)."""
    import hippo_gpu.indexing.build as build

    calls: list[object] = []
    monkeypatch.setattr(build, "build_index", lambda *a, **k: calls.append(a))
    return calls


def _args(out: Path, *extra: str) -> list[str]:
    s = paths()
    return ["index", "--corpus", str(s["corpus"]), "--openie", str(s["openie"]), "--out",
            str(out), "--encoder", "hash:32", "--device", "cpu", "--threads", "1", *extra]


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file and folder under `root` (and root itself): content and mtime."""
    found = {".": (b"", root.stat().st_mtime_ns)} if root.exists() else {}
    for p in sorted(root.rglob("*")) if root.is_dir() else [root] if root.exists() else []:
        found[str(p.relative_to(root)) if p != root else "."] = \
            (p.read_bytes() if p.is_file() else b"", p.stat().st_mtime_ns)
    return found


def _refused(out: Path, *extra: str, calls: list[object]) -> Result:
    """`index --out OUT`: exit 2 within REFUSAL_SECONDS, one line on stderr, no build, nothing
    changed under OUT and no lock held there."""
    before = _snapshot(out)
    started = time.perf_counter()
    res = runner.invoke(app, _args(out, *extra))
    took = time.perf_counter() - started
    assert res.exit_code == 2, res.output
    assert took < REFUSAL_SECONDS, f"refused after {took:.2f} s"
    assert calls == [], "the build ran"
    assert len(res.output.strip().splitlines()) == 1 and res.output.startswith("error:"), \
        res.output
    assert _snapshot(out) == before
    return res


def test_an_existing_index_is_refused_without_replace(index_dir: Path,
                                                      no_build: list[object]) -> None:
    res = _refused(index_dir, calls=no_build)
    assert "already holds an index (version 1)" in res.output and "--replace" in res.output
    assert holder_of(index_dir) is None  # no lock left held


def test_a_refusal_loads_nothing_in_a_fresh_interpreter(index_dir: Path) -> None:
    """The refusal comes before any import of the build: a fresh `hippo-gpu index` loads neither
    torch nor numpy, and its whole process (interpreter start included) is quick."""
    started = time.perf_counter()
    got = run_app(*_args(index_dir))
    took = time.perf_counter() - started
    assert got == {"exit": 2, "loaded": []}
    assert took < 20, took  # generous: a loaded CI machine; the build alone takes longer


def test_a_non_empty_folder_is_refused_even_with_replace(tmp_path: Path,
                                                         no_build: list[object]) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    for extra in ((), ("--replace",)):
        res = _refused(folder, *extra, calls=no_build)
        assert "non-empty directory that is not a hippo-gpu index" in res.output
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]  # no .writer.lock


def test_a_file_is_refused(tmp_path: Path, no_build: list[object]) -> None:
    file = tmp_path / "index"
    file.write_text("not an index")
    for extra in ((), ("--replace",)):
        res = _refused(file, *extra, calls=no_build)
        assert "is a file" in res.output
    assert file.read_text() == "not an index"


def test_an_index_a_writer_holds_is_never_replaced(index_dir: Path,
                                                   no_build: list[object]) -> None:
    with writer_lock(index_dir):
        res = _refused(index_dir, "--replace", calls=no_build)
    assert f"a writer (pid {os.getpid()}) holds this index" in res.output
    assert holder_of(index_dir) is None


def test_an_index_a_writable_server_holds_is_never_replaced(index_dir: Path,
                                                            no_build: list[object]) -> None:
    """A WritableHolder claims its directory for its life (between writes it holds no writer
    lock); `Index.save` over it is refused as well, the library's own guard."""
    from hippo_gpu import Searcher
    from hippo_gpu.serve.writes import WritableHolder
    from hippo_gpu.storage.locks import WriterLockedError

    holder = WritableHolder(Searcher(load_index(index_dir, device="cpu")), index_dir,
                            device="cpu", compact_quiet=None)
    try:
        res = _refused(index_dir, "--replace", calls=no_build)
        assert "a writable server" in res.output and "holds this index" in res.output
        with pytest.raises(WriterLockedError, match="writable server"):
            holder.current.index.save(index_dir)
    finally:
        holder.close()
    assert holder_of(index_dir) is None


def test_replace_builds_a_new_version_of_an_index_nobody_holds(index_dir: Path,
                                                               tmp_path: Path) -> None:
    res = runner.invoke(app, _args(index_dir, "--replace", "--cache-dir", str(tmp_path / "c")))
    assert res.exit_code == 0, res.output
    assert read_manifest(index_dir)["version"] == 2
    assert len(load_index(index_dir, device="cpu").passage_keys) == len(
        json.loads(paths()["corpus"].read_text()))  # the whole sample now


@pytest.fixture()
def writable_server(index_dir: Path) -> Iterator[str]:
    """`hippo-gpu serve --writable` on the index, in a subprocess on 127.0.0.1: its URL."""
    with serve_cli(index_dir, "--writable", env={"HIPPO_GPU_TOKEN": TOKEN}) as url:
        yield url


def test_a_served_writable_index_keeps_its_writes(index_dir: Path, writable_server: str,
                                                  no_build: list[object]) -> None:
    """A real `serve --writable`: between its writes it holds no writer lock, yet --replace is
    refused, and the passage it inserted is still there for its next write to build on."""
    corpus = json.loads(paths()["corpus"].read_text())
    openie = {d["passage"]: d for d in json.loads(paths()["openie"].read_text())["docs"]}
    last = corpus[-1]
    body = {"passages": [{"title": last["title"], "text": last["text"], "triples":
                          openie[f"{last['title']}\n{last['text']}"]["extracted_triples"]}]}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=writable_server, headers=auth, timeout=120) as c:
        inserted = c.post("/v1/passages", json=body).json()
        assert inserted["changed"] and inserted["passages_added"] == 1
        res = _refused(index_dir, "--replace", calls=no_build)
        assert "a writable server" in res.output
        first = load_index(index_dir, device="cpu").passage_keys[0]
        deleted = c.request("DELETE", "/v1/passages", json={"keys": [first]}).json()
        assert deleted["changed"]
    keys = load_index(index_dir, device="cpu").passage_keys
    assert len(keys) == len(corpus) - 1 and first not in keys  # the insert survived, then this
