"""What the full-disk tests share: the sample change every index write here makes, the commit
point among a write's operations, the checks of a failed write (one-line DiskFullError, the
directory unchanged) and of its retry (what an undisturbed run wrote), the k's to fail at, and a
real size-limited tmpfs with a filler. References are fresh builds with the hash:64 encoder
(deterministic), never the code under test."""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hippo_gpu import build_index, load_index
from hippo_gpu.data import Passage
from hippo_gpu.errors import DiskFullError
from hippo_gpu.indexing.index import Index
from hippo_gpu.storage.directory import MANIFEST, read_manifest
from hippo_gpu.storage.safetensors_io import load_safetensors_mmap
from hippo_gpu.versions.writer import IndexWriter
from tests.storage.diskfull import distinct_steps
from tests.versions.index_checks import leftovers, snapshot

ENCODER = "hash:64"


def build(sample: dict, passages: list[Passage], out: Path | None = None) -> Index:
    return build_index(passages, sample["openie"], out, encoder=ENCODER, device="cpu")


# the change every commit here makes: two of the first 20 passages out, the other 10 in
REMOVED = (0, 5)


def stage(w: IndexWriter, sample: dict) -> None:
    w.delete([sample["corpus"][i].key for i in REMOVED])
    w.insert(sample["corpus"][20:], sample["openie"])


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def commit_point(ops: list[str]) -> int:
    """The 1-based number of the first rename of the manifest among `ops` (a commit's, when a
    compaction follows): every failure up to it raises, none after it (the folder's fsync).
    A manifest written in place (no rename: not atomic) commits at its last write."""
    manifest = rf"(.*/)?{re.escape(MANIFEST)}"
    renames = [i for i, op in enumerate(ops, 1)
               if op.startswith("replace ") and re.search(rf"-> {manifest}$", op)]
    writes = [i for i, op in enumerate(ops, 1) if re.fullmatch(rf"write {manifest}", op)]
    assert renames or writes, f"the manifest is never written: {ops}"
    return renames[0] if renames else writes[-1]


def check_error(err: BaseException, index_dir: Path, version: int | None, what: str) -> None:
    """One line, naming the index, the file (inside it) and the version kept."""
    msg = str(err)
    assert isinstance(err, DiskFullError) and err.errno == errno.ENOSPC, repr(err)
    assert "\n" not in msg and msg.startswith(f"{index_dir}: no space left on device for the "
                                              f"{what}"), msg
    assert f"(writing {index_dir}" in msg, msg
    assert f"the index keeps version {version}" in msg, msg


def check_unchanged(index_dir: Path, before: dict[str, str], prev: Index) -> None:
    """Byte for byte what it was (no new file, none changed), and it loads, verified, as the
    version it held."""
    assert snapshot(index_dir) == before
    loaded = load_index(index_dir, device="cpu", verify=True)
    assert loaded.version == prev.version and loaded.passage_keys == prev.passage_keys


def named_files(index_dir: Path) -> dict[str, str]:
    """sha256 of every file the manifest names (its base's and its segments'), by name."""
    m = read_manifest(index_dir)
    files = {**m["files"], **{k: v for s in m.get("segments", []) for k, v in s["files"].items()}}
    return {k: v["sha256"] for k, v in files.items()}


def check_like(index_dir: Path, undisturbed: Path, version: int | None) -> None:
    """The retry wrote what an undisturbed run wrote (which equals a fresh build: each test
    checks that once), loads verified at `version`, and left nothing else. Files are equal
    byte for byte, but for the basis's solve time (its fifth scalar: PassageBasis.tensors)."""
    got, want = named_files(index_dir), named_files(undisturbed)
    assert got.keys() == want.keys()
    for name in [k for k in got if got[k] != want[k]]:
        assert name.endswith("/basis.safetensors"), name
        a, b = (load_safetensors_mmap(root / name) for root in (index_dir, undisturbed))
        for t in (a, b):  # all scalars but the seconds
            t["scalars"] = torch.cat([t["scalars"][:4], t["scalars"][5:]])
        assert a.keys() == b.keys() and all(torch.equal(a[t], b[t]) for t in a), name
    assert load_index(index_dir, device="cpu", verify=True).version == version
    assert leftovers(index_dir) == []


# every step by default (inner write() calls of one file leave the same state as its last);
# every write call behind the slow marker
SWEEPS = [pytest.param(False, id="each_step"),
          pytest.param(True, id="every_write", marks=pytest.mark.slow)]


def faults(ops: list[str], every: bool) -> list[int]:
    return list(range(1, len(ops) + 1)) if every else distinct_steps(ops)


@contextlib.contextmanager
def small_tmpfs(where: Path, size_kib: int) -> Iterator[Path]:
    """A tmpfs of `size_kib` KiB mounted at `where` (skips where mounting is not permitted:
    it needs root, CAP_SYS_ADMIN); unmounted on the way out."""
    where.mkdir(parents=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a size-limited tmpfs needs root and mount(8)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs",
                           str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        gc.collect()  # memory maps of indexes read from it keep it busy
        if subprocess.run(["umount", str(where)]).returncode != 0:
            subprocess.run(["umount", "--lazy", str(where)], check=True)


def fill(folder: Path, leave: int = 0) -> Path:
    """Fill the filesystem of `folder` with one file, then free `leave` bytes of it."""
    filler = folder / f"filler-{uuid.uuid4().hex}"
    with filler.open("wb", buffering=0) as f:
        block = b"\0" * 4096
        with contextlib.suppress(OSError):
            while f.write(block):
                pass
    os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler
