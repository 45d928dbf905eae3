"""Provenance of a benchmark's JSON results line, and the rule for writing one.

Every benchmark in this folder builds its results line with :func:`provenance` and appends it with
:func:`append_result`, so each line says which code ran (commit and whether the tree was dirty),
on what (CPU model, GPU name, thread counts), at which precisions and batch sizes, with which
library versions. The fields, all always present (null when unknown or not applicable):

    provenance       schema version of these fields (1)
    bench            benchmark name ("retrieval", "server", ...)
    time             UTC, ISO 8601, seconds
    commit           `git rev-parse HEAD` of the repository (null: no git or not a checkout)
    dirty            `git status --porcelain` had entries outside benchmarks/results/ (null:
                     unknown); results files are outputs, not code, so appending a line does
                     not make the next run dirty
    dirty_files      how many such entries (null: unknown)
    dirty_paths      the first 20 of them
    hardware         {"cpu": /proc/cpuinfo "model name", "cpu_count", "machine",
                      "gpu": torch.cuda.get_device_name (null without CUDA), "cuda": CUDA version}
    threads          the thread count the benchmark was asked for (null: the library default)
    torch_threads    torch.get_num_threads() when the line is made
    device           where the measured work ran ("cpu", "cuda", "cuda:1", "cpu,cuda")
    encoder_backend  what ran the text encoder (Encoder.backend: "torch", "onnx", "hash",
                     "openai"), a list when the benchmark compares several, or null where it
                     encodes no text; where the encoder runs in another process, the backend
                     that process was asked for (:func:`requested_backend`)
    precision        index embedding precision (Index.precision; "float32" unless asked), or a
                     list when the benchmark compares several
    query_precision  query encoder precision (SearcherOptions.query_precision); null where no
                     query is encoded
    batch_sizes      named batch sizes, e.g. {"query_batch": [1, 16, 100],
                     "encoder_query_batch_size": 16, "encoder_batch_size": 64}: "query_batch" is
                     the queries per Searcher.rank call, "encoder_query_batch_size" the query
                     encoder's batch, "encoder_batch_size" the passage/phrase/fact encoder batch
    versions         python, torch, numpy, and any optional module asked for (null if absent)
    loadavg          os.getloadavg() (the machine may be shared)
    argv             the command line

Dirty trees: a benchmark refuses to append a line when the tree is dirty (or its state unknown)
unless it was given ``--allow-dirty`` (:func:`add_arguments`); with it, the line says
``"dirty": true``. Call :func:`check_clean` before the measurement so a refusal costs nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCHEMA = 1
RESULTS_DIR = "benchmarks/results/"  # outputs: their changes do not make the tree dirty
MAX_DIRTY_PATHS = 20


class DirtyTreeError(RuntimeError):
    """The working tree is dirty (or its state unknown) and --allow-dirty was not given."""


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """Add ``--allow-dirty`` to a benchmark's parser."""
    ap.add_argument(
        "--allow-dirty", action="store_true",
        help="append the results line even if the git tree has uncommitted changes (or no git); "
             "the line is then marked dirty")


def _git(repo: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                             timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def git_state(repo: str | Path = REPO) -> dict[str, Any]:
    """{"commit", "dirty", "dirty_files", "dirty_paths"} of the checkout at `repo`.

    Entries under benchmarks/results/ are ignored; untracked files count (they may be code).
    Every value is None when git or the checkout is unavailable.
    """
    repo = Path(repo)
    commit = _git(repo, "rev-parse", "HEAD")
    status = _git(repo, "status", "--porcelain", "--untracked-files=all")
    if commit is None or status is None:
        return {"commit": None, "dirty": None, "dirty_files": None, "dirty_paths": None}
    paths = [line[3:] for line in status.splitlines() if line.strip()]
    paths = [p for p in paths if not p.strip('"').startswith(RESULTS_DIR)]
    return {"commit": commit.strip(), "dirty": bool(paths), "dirty_files": len(paths),
            "dirty_paths": paths[:MAX_DIRTY_PATHS]}


def check_clean(allow_dirty: bool, repo: str | Path = REPO) -> dict[str, Any]:
    """The git state; raise DirtyTreeError if it is dirty or unknown and not `allow_dirty`."""
    state = git_state(repo)
    if state["dirty"] is not False and not allow_dirty:
        why = ("the git state is unknown (no git or not a checkout)" if state["dirty"] is None
               else f"{state['dirty_files']} uncommitted file(s), e.g. "
                    f"{', '.join(state['dirty_paths'][:3])}")
        raise DirtyTreeError(f"refusing to record a results line: {why}; commit first, or pass "
                             "--allow-dirty to record it marked dirty")
    return state


def cpu_model() -> str:
    """The CPU's "model name" from /proc/cpuinfo (else platform's processor or machine)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware(device: str | None = None) -> dict[str, Any]:
    """CPU model and count; the GPU's name when `device` names CUDA and CUDA is available."""
    import torch

    info: dict[str, Any] = {"cpu": cpu_model(), "cpu_count": os.cpu_count(),
                            "machine": platform.machine(), "gpu": None,
                            "cuda": torch.version.cuda}
    if device is not None and "cuda" in device and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def versions(optional: Iterable[str] = ()) -> dict[str, str | None]:
    """Python, torch, numpy versions, plus each optional module's (None if it does not import)."""
    import numpy as np
    import torch

    out: dict[str, str | None] = {"python": platform.python_version(),
                                  "torch": torch.__version__, "numpy": np.__version__}
    for name in optional:
        try:
            out[name] = getattr(__import__(name), "__version__", None)
        except ImportError:
            out[name] = None
    return out


def provenance(
    bench: str,
    *,
    threads: int | None,
    device: str,
    encoder_backend: str | Sequence[str] | None,
    precision: str | Sequence[str] | None = "float32",
    query_precision: str | Sequence[str] | None = None,
    batch_sizes: Mapping[str, Any] | None = None,
    optional_versions: Iterable[str] = (),
    git: Mapping[str, Any] | None = None,
    repo: str | Path = REPO,
) -> dict[str, Any]:
    """The provenance fields of a results line (see the module docstring for each field).

    Args:
        bench: benchmark name.
        threads: thread count the benchmark set (None: it left the library default).
        device: where the measured work ran.
        encoder_backend: what ran the text encoder, None where no text is encoded. Required:
            performance_doc refuses to quote a line that does not say it.
        precision: index embedding precision(s).
        query_precision: query encoder precision(s), None where no query is encoded.
        batch_sizes: named batch sizes ("query_batch", "encoder_query_batch_size", ...).
        optional_versions: extra modules whose versions to record.
        git: a state from :func:`check_clean` taken before the run (else read now).
    """
    import torch

    state = dict(git) if git is not None else git_state(repo)
    return {
        "provenance": SCHEMA,
        "bench": bench,
        "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": state["commit"],
        "dirty": state["dirty"],
        "dirty_files": state["dirty_files"],
        "dirty_paths": state["dirty_paths"],
        "hardware": hardware(device),
        "threads": threads,
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "encoder_backend": (list(encoder_backend) if isinstance(encoder_backend, (list, tuple))
                            else encoder_backend),
        "precision": list(precision) if isinstance(precision, (list, tuple)) else precision,
        "query_precision": (list(query_precision) if isinstance(query_precision, (list, tuple))
                            else query_precision),
        "batch_sizes": dict(batch_sizes or {}),
        "versions": versions(optional_versions),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "argv": list(sys.argv),
    }


def requested_backend(model: str, backend: str = "auto") -> str:
    """The encoder backend asked of another process: "hash" or "openai" when the model name
    says so (hippo_gpu.embed.Encoder picks them from it), else `backend` as configured."""
    for prefix in ("hash", "openai"):
        if model.startswith(f"{prefix}:"):
            return prefix
    return backend


def append_result(path: str | Path, record: Mapping[str, Any], *, allow_dirty: bool,
                  repo: str | Path = REPO) -> Path:
    """Append `record` as one JSON line to `path`, under the dirty-tree rule.

    The tree is checked again at write time (it may have changed during the run); if it is dirty
    or unknown, DirtyTreeError is raised unless `allow_dirty`, and then the line is marked dirty.
    """
    state = check_clean(allow_dirty, repo)
    line = dict(record)
    before = line.get("dirty", state["dirty"])  # the state when the run started
    if before is True or state["dirty"] is True:  # dirty at either end: dirty
        line["dirty"] = True
    elif before is None or state["dirty"] is None:  # unknown at either end: unknown
        line["dirty"] = None
    else:
        line["dirty"] = False
    if state["dirty"]:
        line["dirty_files"] = max(state["dirty_files"], line.get("dirty_files") or 0)
        line["dirty_paths"] = state["dirty_paths"]
    if state["commit"] is not None and line.get("commit") != state["commit"]:
        line["commit_at_write"] = state["commit"]  # a commit landed during the run
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(line, default=float) + "\n")
    return path
