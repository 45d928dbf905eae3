"""One writer at a time: a second writer (another process, the CLI, a save, or another writer in
the same process) is refused naming the holder's pid; readers are never blocked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hippo_gpu import load_index
from hippo_gpu.cli import app
from hippo_gpu.storage.locks import WriterLockedError
from hippo_gpu.versions.writer import IndexWriter
from tests.versions.index_checks import (
    copy_index,
)

pytestmark = pytest.mark.usefixtures("one_thread")

CHILD = Path(__file__).with_name("writer_fault_child.py")

runner = CliRunner()


def test_second_writer_is_refused(enc, base_dir, tmp_path):
    index_dir = copy_index(base_dir, tmp_path / "index")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, str(CHILD), "hold", str(index_dir)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = child.stdout.readline()
        assert line.startswith("locked "), line
        pid = line.split()[1]
        with pytest.raises(WriterLockedError, match=f"pid {pid}"):
            IndexWriter(index_dir, device="cpu", encoder=enc).open()
        res = runner.invoke(app, ["compact", str(index_dir)])
        assert res.exit_code == 2 and "another writer" in res.output
        with pytest.raises(WriterLockedError):
            load_index(index_dir, device="cpu").save(index_dir)
        assert load_index(index_dir, device="cpu").version == 1  # readers are never blocked
    finally:
        child.stdin.close()
        assert child.wait(timeout=60) == 0
    with IndexWriter(index_dir, device="cpu", encoder=enc) as w:  # the lock is free again
        # within one process too: flock belongs to the open file description
        with pytest.raises(WriterLockedError):
            IndexWriter(index_dir, device="cpu", encoder=enc).open()
        assert w.index.version == 1
