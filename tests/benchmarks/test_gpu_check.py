"""benchmarks/gpu_check.sh: its carry fits the device machine, every benchmark argument it passes
parses, and without CUDA its CUDA run skips every step (CI runs the --device cpu dry run itself)."""

from __future__ import annotations

import argparse
import os
import runpy
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.common import data_root

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"
CARRY_LIMIT = 64 * 2**20  # bytes the device machine takes beside the working tree
MUSIQUE_FILES = ("corpus.json", "questions.json", "openie_gpt-3.5-turbo-1106.json")
needs_bash = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils timeout")


def _commands(device: str) -> dict[str, list[str]]:
    out = subprocess.run(["bash", str(SCRIPT), "--device", device, "--print-commands"],
                         capture_output=True, text=True, timeout=30, check=True)
    cmds = {}
    for line in out.stdout.splitlines():
        name, _, cmd = line.partition(":")
        cmds[name] = shlex.split(cmd)
    return cmds


class _Parsed(Exception):
    pass


_PARSE_ARGS = argparse.ArgumentParser.parse_args


def _parse_with_module(module: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Run `python -m module argv` up to its argparse call: a bad argument exits 2 there."""
    def parse_then_stop(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        _PARSE_ARGS(self, argv, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", [module, *argv])
    with pytest.raises(_Parsed):
        runpy.run_module(module, run_name="__main__", alter_sys=False)


@needs_bash
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_every_benchmark_argument_parses(device, monkeypatch):
    cmds = _commands(device)
    assert {"PARITY_CMD", "PPR100K_CMD", "PPR1M_CMD", "SCALE100K_CMD"} <= set(cmds)
    for name, cmd in cmds.items():
        assert cmd[:2] == ["python3", "-m"], name
        if cmd[2] == "pytest":
            files = [a for a in cmd if a.startswith("tests/")]
            assert files and all((REPO / f).is_file() for f in files), name
            continue
        assert cmd[2].startswith("benchmarks."), name
        _parse_with_module(cmd[2], cmd[3:], monkeypatch)


@needs_bash
def test_cuda_run_passes_the_prpack_floor_and_the_sizes():
    cmds = _commands("cuda")
    ppr = cmds["PPR100K_CMD"]
    assert ppr[ppr.index("--passages") + 1] == "100000"
    assert int(ppr[ppr.index("--prpack-queries") + 1]) >= 8
    assert cmds["PPR1M_CMD"][cmds["PPR1M_CMD"].index("--passages") + 1] == "1000000"


def test_carry_fits_the_device_machine():
    """What docs/gpu_check.md says to carry: musique_train's three files and .gpu_carry/wheels."""
    data = data_root() / "musique_train"
    if not data.is_dir():
        pytest.skip(f"no musique_train under {data.parent}")
    data_size = sum((data / f).stat().st_size for f in MUSIQUE_FILES)
    assert data_size <= 16 * 2**20, "the data alone should leave room for the wheels"
    wheels = REPO / ".gpu_carry" / "wheels"  # measured where a copy is staged
    size = data_size + sum(p.stat().st_size for p in wheels.glob("*") if p.is_file())
    assert size <= CARRY_LIMIT, f"carry {size / 2**20:.1f} MiB > 64 MiB"


def test_kernel_path_maps_kernels_src(tmp_path):
    """Without an install, benchmarks/kernel_path imports kernels/src as hippo_gpu.kernels."""
    code = ("import sys; sys.path[:] = [p for p in sys.path if 'site-packages' not in p "
            "or 'hippo' not in p]\n"
            "import sitecustomize, importlib\n"
            "spec = sitecustomize.KernelsFinder().find_spec('hippo_gpu.kernels')\n"
            "print(spec.origin)\n"
            "print(sitecustomize.KernelsFinder().find_spec('hippo_gpu.kernels.ppr_cpu').origin)")
    env = {**os.environ, "PYTHONPATH": str(REPO / "benchmarks" / "kernel_path")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=env, cwd=tmp_path, check=True)
    origin, leaf = out.stdout.split()
    assert Path(origin) == REPO / "kernels" / "src" / "__init__.py"
    assert Path(leaf) == REPO / "kernels" / "src" / "ppr_cpu.py"


@needs_bash
@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs the steps")
def test_cuda_run_without_cuda_skips_every_step(tmp_path):
    out = subprocess.run(["bash", str(SCRIPT), "--steps", "parity ppr_100k"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OUT": str(tmp_path / "out")}, cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr  # nothing passed: not a pass
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert [ln.split()[:2] for ln in summary[:2]] == [["parity", "SKIP"], ["ppr_100k", "SKIP"]]
    assert summary[-1] == "RESULT: SKIP"
