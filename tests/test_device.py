"""Device specs and precision names: one list of names per concept (hippo_gpu.config), one map
to torch dtypes (hippo_gpu.device)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from hippo_gpu.config import (
    CUDA_FREE_SHARE,
    DEFAULT_CHUNK_BYTES,
    MIN_CHUNK_BYTES,
    PPR_DTYPES,
    PRECISIONS,
    EncoderConfig,
    RetrievalConfig,
)
from hippo_gpu.device import (
    HUGE_PAGE_BYTES,
    check_device,
    chunk_budget,
    host_empty,
    ppr_dtype,
    precision_dtype,
    resolve_device,
)


def test_every_precision_name_is_its_torch_dtype():
    for name in PRECISIONS:
        assert precision_dtype(name) is getattr(torch, name)
        EncoderConfig(precision=name)  # the encoder takes the same names
    for name in PPR_DTYPES:
        assert ppr_dtype(RetrievalConfig(dtype=name)) is getattr(torch, name)


def test_a_name_of_another_concept_is_refused():
    with pytest.raises(ValueError, match="unknown precision 'float64'"):
        precision_dtype("float64")  # a PPR dtype, not an embedding precision
    with pytest.raises(ValueError, match="dtype must be one of"):
        RetrievalConfig(dtype="bfloat16")  # an embedding precision, not a PPR dtype
    with pytest.raises(ValueError, match="precision must be one of"):
        EncoderConfig(precision="float64")


def test_check_device_parses_without_asking_for_the_device():
    assert check_device("auto") is None and check_device(None) is None
    assert check_device("cuda:1") == torch.device("cuda:1")  # even on a machine without CUDA
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        check_device("gpu")


def test_host_empty_gives_writable_tensors_that_outlive_their_views():
    small = host_empty((3, 4))
    assert small.shape == (3, 4) and small.dtype == torch.float32
    rows = HUGE_PAGE_BYTES // (64 * 4) + 7  # over the threshold: the memory-map branch
    big = host_empty((rows, 64))
    assert big.shape == (rows, 64) and big.is_contiguous()
    big.copy_(torch.arange(rows * 64, dtype=torch.float32).view(rows, 64))
    tail = big[-2:]
    del big  # the view keeps the map alive
    want = torch.arange((rows - 2) * 64, rows * 64, dtype=torch.float32).view(2, 64)
    assert torch.equal(tail, want)
    assert torch.equal(host_empty((2, 3), torch.int64).fill_(5), torch.full((2, 3), 5))


_REFAULT = """
import resource, sys, torch
from hippo_gpu.device import keep_large_allocations_in_heap
kept = keep_large_allocations_in_heap() if sys.argv[1] == "keep" else None
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
x = torch.empty(256 << 20, dtype=torch.uint8); x.fill_(1); del x  # 256 MiB touched, freed
before = faults()
y = torch.empty(192 << 20, dtype=torch.uint8); y.fill_(2)  # fits the freed block
print(kept, faults() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_a_kept_heap_refills_a_freed_large_block_without_page_faults():
    """Without the setting glibc unmaps the freed 256 MiB and a second block of 192 MiB faults
    in all its 49,152 pages again; with it the heap keeps the freed block and the second one is
    carved from it. (Smaller, because torch's aligned allocation needs some slack: a block of
    the same size may not fit the freed one exactly.)"""
    def run(mode: str) -> tuple[str, int]:
        out = subprocess.run([sys.executable, "-c", _REFAULT, mode], capture_output=True,
                             text=True, check=True).stdout.split()
        return out[0], int(out[1])

    kept, with_heap = run("keep")
    _, without = run("plain")
    assert kept == "True"
    assert without > 40_000  # 4 KiB pages faulted again (numpy-free torch.empty: no THP advice)
    assert with_heap < without / 10


def test_the_cuda_chunk_budget_grows_with_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA the batch per solve is sized from the memory free when the call starts (mocked
    here: no device is touched): half of it, the allocator's unused cache counted as free."""
    from types import SimpleNamespace

    from hippo_gpu.retrieval.seeds import plan_chunks

    free = {"bytes": 8 << 30}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free["bytes"], 80 << 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 3 << 30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 1 << 30)
    cuda, cfg = torch.device("cuda"), RetrievalConfig()
    assert chunk_budget(cfg, cuda) == int(((8 << 30) + (2 << 30)) * CUDA_FREE_SHARE)
    # a million-passage index: a query column costs ~0.2 GB, so 8 columns fit 1.75 GiB
    index = SimpleNamespace(device=cuda, num_nodes=10_000_000, passage_keys=range(1_000_000),
                            facts=range(9_000_000), phrases=range(9_000_000))
    cols = []
    for gib in (4, 16, 70):
        free["bytes"] = gib << 30
        cols.append(plan_chunks(index, 4096, cfg).query_cols)
    assert cols == sorted(cols) and cols[0] < cols[-1] and cols[-1] >= 64, cols
    free["bytes"] = 0  # a full device still gets a working budget
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 1 << 30)
    assert chunk_budget(cfg, cuda) == MIN_CHUNK_BYTES
    # the CPU keeps its fixed default, and a set chunk_bytes wins everywhere
    assert chunk_budget(cfg, torch.device("cpu")) == DEFAULT_CHUNK_BYTES
    assert chunk_budget(RetrievalConfig(chunk_bytes=12345), cuda) == 12345
    index.device = torch.device("cpu")
    assert plan_chunks(index, 4096, cfg).query_cols == 8

