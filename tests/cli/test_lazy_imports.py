"""`hippo-gpu --help`, every command's `--help` and `stats` import no torch (nor numpy): the
commands import their heavy modules inside themselves, hippo_gpu.__init__ on first use, and
`stats` reads the manifest. Each check is a fresh interpreter, since this one has torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer

import hippo_gpu
from hippo_gpu.cli import app
from tests.cli.helpers import ROOT, run_app

COMMANDS = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def test_every_command_is_checked() -> None:
    assert {"index", "stats", "insert", "delete", "compact", "eval", "retrieve", "serve",
            "mcp", "demo"} <= set(COMMANDS)


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_imports_no_torch(command: str | None) -> None:
    got = run_app(*([command] if command else []), "--help")
    assert got == {"exit": 0, "loaded": []}, f"hippo-gpu {command or ''} --help: {got}"


def test_stats_imports_no_torch(sample_index_dir: Path) -> None:
    for args in ([], ["--json"]):
        got = run_app("stats", str(sample_index_dir), *args)
        assert got == {"exit": 0, "loaded": []}, got


def test_the_package_imports_its_api_on_first_use() -> None:
    code = ("import sys, hippo_gpu\nassert 'torch' not in sys.modules\n"
            "from hippo_gpu import IndexConfig, __version__\n"
            "assert 'torch' not in sys.modules\n"
            "from hippo_gpu import Searcher, retrieval\nassert 'torch' in sys.modules\n"
            "print(Searcher.__module__, retrieval.__name__, __version__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.split() == ["hippo_gpu.retrieval.searcher", "hippo_gpu.retrieval",
                                  hippo_gpu.__version__]


def test_the_lazy_names_are_the_public_api() -> None:
    import importlib

    assert sorted(hippo_gpu.__all__) == sorted([*hippo_gpu._SOURCES, "__version__"])
    for name in hippo_gpu.__all__:
        value = getattr(hippo_gpu, name)
        if name != "__version__":
            assert value is getattr(importlib.import_module(hippo_gpu._SOURCES[name]), name)
    assert set(hippo_gpu.__all__) <= set(dir(hippo_gpu))
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        hippo_gpu.nothing_here  # noqa: B018
