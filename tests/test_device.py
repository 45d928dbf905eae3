"""Device specs and precision names: one list of names per concept (hippo_gpu.config), one map
to torch dtypes (hippo_gpu.device)."""

from __future__ import annotations

import pytest
import torch

from hippo_gpu.config import PPR_DTYPES, PRECISIONS, EncoderConfig, RetrievalConfig
from hippo_gpu.device import (
    HUGE_PAGE_BYTES,
    check_device,
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
