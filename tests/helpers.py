"""What several test files share: the repository root, the data folders, sample queries, and the
rule for a missing prerequisite (skip locally, fail under CI), the comparison of two passage
bases, thread pools of a given size. Fixtures live in conftest.py."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("HIPPO_DATA_DIR", REPO.parent / "shared" / "data"))
MUSIQUE = DATA_DIR / "musique_train"

# three multi-hop questions about the bundled sample corpus
QUERIES = [
    "Which river flows through the birthplace of the inventor of the tidal clock?",
    "Who founded the college where the director of the Lumen Museum studied?",
    "Who designed the lighthouse on Skerrow?",
]


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """torch and faiss thread pools of `n` threads, restored afterwards (faiss where the optional
    extra is installed)."""
    try:
        import faiss
    except ImportError:  # an optional extra: then the exact torch backend runs the kNN
        faiss = None
    before = torch.get_num_threads(), faiss.omp_get_max_threads() if faiss else 0
    torch.set_num_threads(n)
    if faiss:
        faiss.omp_set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before[0])
        if faiss:
            faiss.omp_set_num_threads(before[1])


def missing_in_ci(what: str) -> None:
    """A missing prerequisite: skip locally, but fail under CI (CI=true), naming it, so a CI run
    without the data can never pass by skipping the tests that need it."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"CI: {what}", pytrace=False)
    pytest.skip(what)


def musique_or_skip() -> Path:
    if not (MUSIQUE / "corpus.json").exists():
        missing_in_ci(f"musique_train data not found at {MUSIQUE} (set HIPPO_DATA_DIR to the "
                      "folder holding musique_train/)")
    return MUSIQUE


def transition_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖M_a − M_b‖₁ (the largest column L1 difference) of the transitions M = A D⁻¹ of two
    symmetric [N, N] sparse CSR graphs on the same nodes: 0 exactly when they are equal."""
    def scaled_rows(adj: torch.Tensor) -> torch.Tensor:
        # column u of M is row u of A over D_u (A is symmetric): rows of Mᵀ, as COO
        coo = adj.to_sparse_coo().coalesce().double()
        idx, val = coo.indices(), coo.values()
        deg = torch.zeros(adj.shape[0], dtype=torch.float64).index_add_(0, idx[0], val)
        return torch.sparse_coo_tensor(idx, val / deg[idx[0]], adj.shape)

    diff = (scaled_rows(a) - scaled_rows(b)).coalesce()
    per_col = torch.zeros(a.shape[0], dtype=torch.float64).index_add_(
        0, diff.indices()[0], diff.values().abs())
    return float(per_col.max()) if per_col.numel() else 0.0


def assert_basis_close(got, want, *, gap: float = 0.0,
                       passage_emb: torch.Tensor | None = None) -> None:
    """Two PassageBasis agree within their certified bounds (hippo_gpu.ppr.basis): each column
    of Z and z1 in L1 within the sum of both bounds (plus the float64 rounding of Z = L b − z1),
    h within the sum of both h_err; same damping, tol and shapes.

    `gap` = ‖M_got − M_want‖₁ (transition_gap) widens that by what the graphs' difference can
    move an exact solution: (I − dM')(y' − y) = d(M' − M)y, so ‖y' − y‖₁ ≤ d/(1 − d)·gap·‖b‖₁
    for a reset vector b ≥ 0 (‖(I − dM')⁻¹‖₁ ≤ 1/(1 − d), ‖y‖₁ ≤ ‖b‖₁); for Z_j = L b_j − z1
    with b_j = E_P[:, j] + 1 and z1 = L 1_P that is d/(1 − d)·gap·(‖b_j‖₁ + P), and for h (max
    norm, ‖h‖_∞ ≤ 1) d/(1 − d)·gap. `passage_emb` [P, D] gives ‖b_j‖₁ (needed when gap > 0).
    """
    assert got is not None and want is not None
    assert (got.damping, got.tol) == (want.damping, want.tol)
    assert got.z.shape == want.z.shape and got.h.shape == want.h.shape
    p = got.z.shape[0]
    lip = got.damping / (1.0 - got.damping) * gap
    b_norm = (passage_emb.double() + 1.0).sum(dim=0) if gap > 0 else torch.zeros(1)
    rounding = 4 * 2.0 ** -53 * (got.z_norm1 + want.z_norm1 + got.z1.abs().sum())
    col = (got.z - want.z).abs().sum(dim=0)  # [D]
    allowed = got.col_bound + want.col_bound + rounding + lip * (b_norm + p)
    assert bool((col <= allowed).all()), \
        f"Z columns differ by up to {float((col - allowed).max()):.3g} beyond their bounds"
    assert float((got.z1 - want.z1).abs().sum()) <= got.z1_bound + want.z1_bound + lip * p
    # each h lies within its h_err above the true one (ppr/basis.py, ppr/basis_update.py)
    errs = [b.h_err if math.isfinite(b.h_err) else 1e-11 for b in (got, want)]
    torch.testing.assert_close(got.h, want.h, rtol=0, atol=sum(errs) + lip)
