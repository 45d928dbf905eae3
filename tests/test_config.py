"""hippo_gpu.config: the names every module shares, and the validation at construction."""

from __future__ import annotations

from pathlib import Path

import pytest

from hippo_gpu.config import (
    MODES,
    PPR_METHODS,
    PRECISIONS,
    EncoderConfig,
    RetrievalConfig,
    cache_root,
)


def test_ppr_methods_are_the_solvers_and_the_old_name_is_refused_with_a_hint() -> None:
    for method in PPR_METHODS:
        assert RetrievalConfig(ppr_method=method).ppr_method == method
    with pytest.raises(ValueError, match=r'"iterate" is now "power"'):
        RetrievalConfig(ppr_method="iterate")
    with pytest.raises(ValueError, match="unknown PPR method 'cg'"):
        RetrievalConfig(ppr_method="cg")


def test_retrieval_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="ppr_max_iter must be >= 1"):
        RetrievalConfig(ppr_max_iter=0)
    with pytest.raises(ValueError, match="damping"):
        RetrievalConfig(damping=1.0)
    with pytest.raises(ValueError, match="dtype"):
        RetrievalConfig(dtype="float16")


def test_shared_names() -> None:
    assert len(set(MODES)) == len(MODES) == 4
    assert "float32" in PRECISIONS and "float64" not in PRECISIONS  # PPR dtypes are separate
    with pytest.raises(ValueError, match="precision"):
        EncoderConfig(precision="float64")


def test_cache_root_follows_the_environment(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    monkeypatch.setenv("HIPPO_GPU_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    monkeypatch.setenv("HIPPO_GPU_CACHE", "")
    assert cache_root() == Path.home() / ".cache" / "hippo_gpu"
