"""The only place that turns a device spec ("auto", "cpu", "cuda", "cuda:1") into a torch.device,
and precision names (hippo_gpu.config.PRECISIONS, PPR_DTYPES) into torch dtypes; the thread
count, and host buffers advised for huge pages (host_empty)."""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import mmap
import sys

import torch

from hippo_gpu.config import (
    CUDA_FREE_SHARE,
    DEFAULT_CHUNK_BYTES,
    DEVICE_CHOICES,
    MIN_CHUNK_BYTES,
    PPR_DTYPES,
    PRECISIONS,
    PPRSettings,
    RetrievalConfig,
)


def check_device(spec: str | torch.device | None) -> torch.device | None:
    """The torch.device a device spec names (None for "auto" or None), without asking whether
    this machine has it (a spec may be made here and opened on another machine).

    Raises:
        ValueError: `spec` names no device.
    """
    if isinstance(spec, torch.device):
        return spec
    if spec is None or spec == "auto":
        return None
    try:
        return torch.device(spec)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"unknown device {spec!r}; use one of {DEVICE_CHOICES}") from e


def resolve_device(spec: str | torch.device | None = "auto") -> torch.device:
    """Resolve a user-facing device spec.

    "auto" (or None) picks CUDA when it is available, else the CPU. Asking for CUDA on a machine
    without it is an error rather than a silent fallback.
    """
    device = check_device(spec)
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} was requested but CUDA is not available")
    return device


def set_threads(threads: int | None = None) -> int:
    """Set torch's intra-op thread count (None: its current one) in the calling OS thread too;
    return the count in use.

    torch keeps one intra-op count for the process, but its OpenMP runtime keeps one per OS
    thread, and a thread that never set it starts at the machine's default: measured on a
    2-core machine, a query run in a fresh thread after ``torch.set_num_threads(1)`` reduced
    on 2 threads while torch reported 1, and its float32 PPR differed at round-off from the
    same query on the main thread (a server's worker threads answered one request with the one
    bits and the next with the other). Setting the count (again) applies it to this thread; it
    costs microseconds, so every entry point that computes (Searcher.rank, a writer's commit
    and compaction) calls ``set_threads()`` first.
    """
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    torch.set_num_threads(torch.get_num_threads() if threads is None else threads)
    return torch.get_num_threads()


# Every precision name is the name of its torch dtype. Embeddings default to float32 on every
# device (it reproduces the official figures); half precision only on request.
_TORCH_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name)
                                         for name in PRECISIONS + PPR_DTYPES}


def chunk_budget(config: RetrievalConfig, device: torch.device) -> int:
    """The working-memory budget in bytes of one retrieval chunk on `device`: the config's
    chunk_bytes when set; else on CUDA CUDA_FREE_SHARE of the memory free now (the device's
    free memory plus the blocks torch's caching allocator holds unused, which it reuses first),
    at least MIN_CHUNK_BYTES; else DEFAULT_CHUNK_BYTES."""
    if config.chunk_bytes is not None:
        return config.chunk_bytes
    if device.type != "cuda":
        return DEFAULT_CHUNK_BYTES
    free, _total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return max(MIN_CHUNK_BYTES, int((free + max(cached, 0)) * CUDA_FREE_SHARE))


def precision_dtype(precision: str) -> torch.dtype:
    """The torch dtype of an embedding precision name (hippo_gpu.config.PRECISIONS)."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; use one of {PRECISIONS}")
    return _TORCH_DTYPES[precision]


def ppr_dtype(config: RetrievalConfig | PPRSettings) -> torch.dtype:
    """The torch dtype of the PPR solve `config` asks for (config.dtype, one of PPR_DTYPES:
    torch.float32 or torch.float64; RetrievalConfig and PPRSettings validate the name)."""
    return _TORCH_DTYPES[config.dtype]


HUGE_PAGE_BYTES = 32 << 20  # host_empty: buffers from this size up are advised for huge pages


def host_empty(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised CPU tensor; from HUGE_PAGE_BYTES up, an anonymous private memory map
    advised for transparent huge pages (Linux MADV_HUGEPAGE), else (or where the platform has
    no such advice) torch.empty.

    Why: a commit and a chain's load fill fresh matrices the size of the index (the embedding
    copies, placed_rows.placed and PendingRows.settle), and torch's allocator maps them in 4 KiB
    pages, one page fault per page on the first write. numpy already advises its large arrays
    this way; torch only under THP_MEM_ALLOC_ENABLE=1, which a library should not set for its
    caller's process. Measured on this project's VM (2-core EPYC, Linux 6.18 with THP set to
    `madvise`): filling 2.8 GB again after freeing it took 0.86-1.22 s in 4 KiB pages (684k
    faults) and 0.17-0.21 s advised (1.4k faults); the embedding copies of a commit at 300k
    passages went from 0.67-0.72 s to 0.15 s. The tensor keeps the map alive and the map is
    unmapped when the last tensor or view of it is freed (torch.frombuffer holds it).
    """
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < HUGE_PAGE_BYTES or advice is None or not hasattr(mmap, "MAP_ANONYMOUS"):
        return torch.empty(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        buf.madvise(advice)
    except OSError:  # THP compiled out or disabled: plain pages, still correct
        pass
    return torch.frombuffer(buf, dtype=dtype).view(shape)


HEAP_REUSE_BYTES = 1 << 30  # keep_large_allocations_in_heap: the mmap and trim thresholds


def keep_large_allocations_in_heap() -> bool:
    """Serve allocations below HEAP_REUSE_BYTES from glibc's heap and keep up to that much
    freed memory there (mallopt M_MMAP_THRESHOLD and M_TRIM_THRESHOLD); True if set (glibc on
    Linux), False elsewhere (nothing changes).

    Why: glibc maps every block above its dynamic threshold (at most 32 MiB) afresh and unmaps
    it on free, so a process that repeatedly allocates arrays the size of the index pays the
    first-write page faults of all of them every time. An IndexWriter's commit is such a
    process: at 300k synthetic passages its arrays over the 11.8M adjacency entries and 2.9M
    nodes (masks, gathers, the merged CSR) took 40-60k page faults and 0.6-1.2 s of system time
    per commit; with the heap kept, 2.4k faults and 0.2-0.3 s (this project's 2-core EPYC VM,
    which charges 8-16 us per first fault of a page). The cost: freed memory up to
    HEAP_REUSE_BYTES stays with the process instead of going back to the OS. Process-wide and
    idempotent; the writer sets it when it opens.
    """
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    return bool(mallopt(m_mmap_threshold, HEAP_REUSE_BYTES)) and \
        bool(mallopt(m_trim_threshold, HEAP_REUSE_BYTES))
