"""Which PPR answers hipporag2 is chosen once per call: on the CPU, "auto" takes the basis and
the host push when the index has a basis of the call's damping; on CUDA it iterates (one
batched device solve, no host round trip: passage_ppr.linear_ppr says why). No device is
touched: the CUDA case reads a view of the index that names CUDA as its device."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hippo_gpu.config import RetrievalConfig
from hippo_gpu.retrieval.passage_ppr import linear_ppr


def test_auto_pushes_on_the_cpu_and_iterates_on_cuda(sample_index) -> None:
    pytest.importorskip("numba")  # the push kernel: without it "auto" iterates everywhere
    assert sample_index.basis is not None and sample_index.device.type == "cpu"
    assert linear_ppr(sample_index, RetrievalConfig()) is not None
    on_cuda = SimpleNamespace(passage_keys=sample_index.passage_keys, basis=sample_index.basis,
                              device=torch.device("cuda"))
    assert linear_ppr(on_cuda, RetrievalConfig()) is None  # type: ignore[arg-type]
    assert linear_ppr(sample_index, RetrievalConfig(ppr_method="chebyshev")) is None
    other_damping = RetrievalConfig(damping=0.6)  # no stored basis of this damping: iterate
    assert linear_ppr(sample_index, other_damping) is None
