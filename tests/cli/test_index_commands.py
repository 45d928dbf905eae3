"""`stats` read from the manifest equals the loaded index's `stats()` in every state an index
directory can be in; `insert` / `delete` open the index without hashing it and a corrupt file
stays refused (hippo_gpu/versions/writer.py: why skipping the checksums at open keeps the
guarantees)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from hippo_gpu import IndexWriter, build_index, load_index
from hippo_gpu.cli import app
from hippo_gpu.sample import paths
from hippo_gpu.storage.directory import IndexFormatError, manifest_stats, read_manifest

runner = CliRunner()
HELD_OUT = 2  # the sample's last passages, inserted by the tests


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample corpus less its last HELD_OUT passages, indexed with the weightless hash:32
    encoder (with its basis); the tests copy it."""
    corpus = json.loads(paths()["corpus"].read_text())
    out = tmp_path_factory.mktemp("cli_index") / "index"
    build_index(corpus[:-HELD_OUT], paths()["openie"], out, encoder="hash:32", device="cpu")
    return out


@pytest.fixture()
def index_dir(built: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(built, tmp_path / "index"))


def _passage_file(tmp_path: Path, which: int) -> Path:
    corpus = json.loads(paths()["corpus"].read_text())
    path = tmp_path / f"passage_{which}.json"
    path.write_text(json.dumps([corpus[which]]))
    return path


def _insert(index_dir: Path, tmp_path: Path, which: int = -1) -> Result:
    return runner.invoke(app, ["insert", str(index_dir), "--corpus",
                               str(_passage_file(tmp_path, which)), "--openie",
                               str(paths()["openie"]), "--device", "cpu", "--threads", "1",
                               "--cache-dir", str(tmp_path / "cache")])


def _stats(index_dir: Path) -> dict:
    res = runner.invoke(app, ["stats", str(index_dir), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _same_stats(index_dir: Path) -> dict:
    """`stats --json`, checked equal to the loaded index's and read from the manifest."""
    got = _stats(index_dir)
    assert got == load_index(index_dir, device="cpu").stats()
    assert manifest_stats(read_manifest(index_dir)) == got
    return got


def test_stats_from_the_manifest_in_every_state(index_dir: Path, tmp_path: Path) -> None:
    base = _same_stats(index_dir)  # a build: its basis
    assert base["basis_bytes"] > 0 and base["basis_damping"] == 0.5
    res = _insert(index_dir, tmp_path)
    assert res.exit_code == 0, res.output
    chain = _same_stats(index_dir)  # a segment: replayed, no basis
    assert chain["passage_nodes"] == base["passage_nodes"] + 1 and chain["basis_bytes"] == 0
    res = runner.invoke(app, ["compact", str(index_dir), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    compacted = _same_stats(index_dir)  # a compaction: a new base with its basis solved
    assert compacted["basis_bytes"] > 0
    assert {k: v for k, v in compacted.items() if not k.startswith("basis_")} == \
        {k: v for k, v in chain.items() if not k.startswith("basis_")}


def test_stats_of_a_manifest_without_the_basis_summary_loads_the_index(index_dir: Path) -> None:
    """A manifest written before the summary (or format 3): stats loads the index, as before."""
    want = _stats(index_dir)
    path = index_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["basis"]
    path.write_text(json.dumps(manifest))
    assert manifest_stats(read_manifest(index_dir)) is None
    assert _stats(index_dir) == want


def test_stats_table_prints_every_count(index_dir: Path) -> None:
    res = runner.invoke(app, ["stats", str(index_dir)])
    assert res.exit_code == 0, res.output
    for key, value in _stats(index_dir).items():
        assert key in res.output and str(value) in res.output


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # the last tensor's last byte: the same size, another checksum
    path.write_bytes(bytes(data))


def test_insert_and_delete_do_not_hash_the_index_and_corruption_stays_refused(
        index_dir: Path, tmp_path: Path) -> None:
    emb = next(index_dir.glob("v*/embeddings.safetensors"))
    _flip_last_byte(emb)
    res = _insert(index_dir, tmp_path)  # no checksum at open: the commit goes through
    assert res.exit_code == 0, res.output
    keys = tmp_path / "keys.txt"
    keys.write_text(load_index(index_dir, device="cpu", verify=False).passage_keys[0] + "\n")
    res = runner.invoke(app, ["delete", str(index_dir), "--keys", str(keys)])
    assert res.exit_code == 0, res.output
    version = read_manifest(index_dir)["version"]
    # the corrupt base file still fails its checksum for every verifying reader ...
    with pytest.raises(IndexFormatError, match="checksum mismatch"):
        load_index(index_dir, device="cpu")
    # ... and no compaction copies it into a new base with new checksums
    with IndexWriter(index_dir, device="cpu", compact_after=None, verify=False) as w:
        with pytest.raises(IndexFormatError, match="checksum mismatch"):
            w.compact()
    res = runner.invoke(app, ["compact", str(index_dir), "--device", "cpu"])
    assert res.exit_code == 2 and "checksum mismatch" in res.output
    assert read_manifest(index_dir)["version"] == version
    assert [p.name for p in index_dir.glob("v*")] == [emb.parent.name]


def test_insert_refuses_a_file_of_another_size(index_dir: Path, tmp_path: Path) -> None:
    emb = next(index_dir.glob("v*/embeddings.safetensors"))
    with emb.open("ab") as f:
        f.write(b"\0")
    version = read_manifest(index_dir)["version"]
    res = _insert(index_dir, tmp_path)
    assert res.exit_code == 2 and "not the size" in res.output, res.output
    assert read_manifest(index_dir)["version"] == version


def test_an_unverified_writer_compacts_a_sound_index(index_dir: Path, tmp_path: Path) -> None:
    res = _insert(index_dir, tmp_path)
    assert res.exit_code == 0, res.output
    with IndexWriter(index_dir, device="cpu", compact_after=None, verify=False) as w:
        w.compact()
        assert "verify" in w.last_compaction
    assert not read_manifest(index_dir)["segments"]
    _same_stats(index_dir)


def test_insert_with_an_llm_commits_its_docs_and_writes_openie_only_when_asked(
        built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`insert --llm` hands the extracted docs to the writer: no OpenIE file is written, and the
    index equals one where `insert --openie` read the file that `--openie-out` asks for (the
    same extraction, from the LLM cache)."""
    from tests.llm.fake_llm_server import FaultServer

    monkeypatch.setenv("HIPPO_GPU_CACHE", str(tmp_path / "cache"))  # the LLM cache goes here
    corpus = tmp_path / "new.json"
    corpus.write_text(json.dumps([{"title": "Zorvan", "text": "Zorvan is a port town."},
                                  {"title": "Quillet", "text": "Quillet lies on a river."}]))
    dirs = {name: Path(shutil.copytree(built, tmp_path / name / "index"))
            for name in ("docs", "asked", "file")}
    openie = tmp_path / "asked" / "extracted.json"
    server = FaultServer()

    def insert(index_dir: Path, *source: str) -> Result:
        return runner.invoke(app, ["insert", str(index_dir), "--corpus", str(corpus), *source,
                                   "--device", "cpu", "--threads", "1",
                                   "--cache-dir", str(tmp_path / "embeddings")])

    try:
        llm = ["--llm", f"openai:fake@{server.url}"]
        res = insert(dirs["docs"], *llm)
        assert res.exit_code == 0, res.output
        assert sorted(p.name for p in dirs["docs"].parent.iterdir()) == ["index"]
        res = insert(dirs["asked"], *llm, "--openie-out", str(openie))
        assert res.exit_code == 0, res.output
        res = insert(dirs["file"], "--openie-out", str(openie))  # no --llm to write it
        assert res.exit_code == 2 and "--openie-out needs --llm" in res.output
    finally:
        server.close()
    res = insert(dirs["file"], "--openie", str(openie))
    assert res.exit_code == 0, res.output
    got, want = (load_index(dirs[n], device="cpu") for n in ("docs", "file"))
    assert got.stats() == want.stats() and got.passage_keys == want.passage_keys
    assert list(got.facts) == list(want.facts) and "zorvan town" in got.phrases
    assert load_index(dirs["asked"], device="cpu").stats() == want.stats()


def test_insert_allow_missing_openie_inserts_the_passages_the_file_lacks(
        index_dir: Path, tmp_path: Path) -> None:
    """The coverage error's hint (`--allow-missing-openie`) is an option of `insert` too: without
    it an OpenIE file that lacks a new passage is refused and nothing is committed; with it the
    passage is inserted without triples."""
    corpus = tmp_path / "new.json"
    corpus.write_text(json.dumps([{"title": "Zorvan", "text": "Zorvan is a port town."}]))
    before = _same_stats(index_dir)
    args = ["insert", str(index_dir), "--corpus", str(corpus), "--openie",
            str(paths()["openie"]), "--device", "cpu", "--threads", "1",
            "--cache-dir", str(tmp_path / "cache")]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2 and "--allow-missing-openie" in refused.output
    assert _same_stats(index_dir) == before
    res = runner.invoke(app, [*args, "--allow-missing-openie"])
    assert res.exit_code == 0, res.output
    assert _same_stats(index_dir)["passage_nodes"] == before["passage_nodes"] + 1
    no_file = runner.invoke(app, ["insert", str(index_dir), "--corpus", str(corpus), "--llm",
                                  "local:smollm2", "--allow-missing-openie"])
    assert no_file.exit_code == 2 and "needs --openie" in no_file.output
