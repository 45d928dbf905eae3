"""One fused PPR step on CUDA (Triton): CSR row-block SpMM + residual + Chebyshev update.

For the [N, Q] row-major batch, one launch computes, for every row i and column q,

    g[i, q] = base[i, q] + d · Σ_{e in row i} M_e · y[j_e, q]                  (the SpMM)
    res[q] += |g[i, q] − y[i, q]|,   mass[q] += g[i, q]                       (if ``measure``)
    y_prev[i, q] ← y_prev[i, q] + ω (g[i, q] − y_prev[i, q])                  (if ω is given)

which the torch path does in four passes over [N, Q] (addmm, sub/abs/sum, sum, lerp). It is the
:data:`hippo_gpu.ppr.StepFn` contract, so :func:`hippo_gpu.ppr.ppr_solve` runs it unchanged
(either method). A program owns BLOCK_R consecutive rows x
BLOCK_Q columns and walks the nonzeros of its rows in lock-step (masked beyond each row's end), so
each gather reads BLOCK_Q contiguous values of a y row; the column sums are one atomic add per
program and column (their order, hence the last bits of the residual, varies between runs: it
only decides when a column stops). Off by default: cuSPARSE stays the CUDA path until
benchmarks/gpu_ppr_kernel_check.py shows this faster. ``TRITON_INTERPRET=1`` runs it on CPU
tensors (tests/ppr/test_kernels.py).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["make_step", "ppr_step"]

INTERPRET = os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


@triton.jit
def _ppr_step_kernel(
    crow, col, val, y, y_prev, base, g_out, res, mass, scalars,
    n_rows, n_cols,
    BLOCK_R: tl.constexpr, BLOCK_Q: tl.constexpr, LERP: tl.constexpr, MEASURE: tl.constexpr,
):
    damping = tl.load(scalars)  # d and ω in the batch's dtype (a Python float would be fp32)
    omega = tl.load(scalars + 1)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    start = tl.load(crow + rows, mask=row_ok, other=0).to(tl.int64)
    count = tl.load(crow + rows + 1, mask=row_ok, other=0).to(tl.int64) - start
    acc = tl.zeros((BLOCK_R, BLOCK_Q), dtype=y.dtype.element_ty)
    for e in range(0, tl.max(count, axis=0)):
        live = e < count
        j = tl.load(col + start + e, mask=live, other=0).to(tl.int64)
        v = tl.load(val + start + e, mask=live, other=0.0)
        y_j = tl.load(y + j[:, None] * n_cols + cols[None, :],
                      mask=live[:, None] & col_ok[None, :], other=0.0)
        acc += v[:, None] * y_j
    at = rows.to(tl.int64)[:, None] * n_cols + cols[None, :]
    ok = row_ok[:, None] & col_ok[None, :]
    g = tl.load(base + at, mask=ok, other=0.0) + damping * acc
    tl.store(g_out + at, g, mask=ok)
    if MEASURE:
        y_i = tl.load(y + at, mask=ok, other=0.0)
        tl.atomic_add(res + cols, tl.sum(tl.abs(g - y_i), axis=0), mask=col_ok)
        tl.atomic_add(mass + cols, tl.sum(g, axis=0), mask=col_ok)
    if LERP:
        prev = tl.load(y_prev + at, mask=ok, other=0.0)
        tl.store(y_prev + at, prev + omega * (g - prev), mask=ok)


def ppr_step(
    matrix: Tensor,
    damping: float,
    base: Tensor,
    y: Tensor,
    y_prev: Tensor,
    g: Tensor,
    omega: float | None,
    measure: bool,
    *,
    block_rows: int = 16,
) -> tuple[Tensor, Tensor] | None:
    """One fused step (module docstring); returns (Σ|g − y| [Q], Σ g [Q]) when ``measure``.

    Args:
        matrix: [N, N] CSR M = A D⁻¹ (int32 or int64 indices) on the batch's device.
        base: [N, Q] (1 − d) r̂; y, y_prev, g: [N, Q]; all C-contiguous, one float dtype.
    """
    n, q = y.shape
    tensors = (base, y, y_prev, g)
    if matrix.layout != torch.sparse_csr or matrix.shape != (n, n):
        raise ValueError(f"matrix must be [N={n}, N] CSR, got {matrix.layout} {matrix.shape}")
    if any(t.shape != (n, q) or t.dtype != y.dtype or not t.is_contiguous() for t in tensors):
        raise ValueError("base, y, y_prev and g must be contiguous [N, Q] of one dtype")
    if y.dtype not in (torch.float32, torch.float64) or matrix.values().dtype != y.dtype:
        raise ValueError(f"need float32/float64 values matching y ({y.dtype})")
    if not INTERPRET and not all(t.is_cuda for t in (*tensors, matrix)):
        raise ValueError("the Triton PPR step runs on CUDA tensors (or with TRITON_INTERPRET=1)")
    res = torch.zeros(q, dtype=y.dtype, device=y.device)
    mass = torch.zeros(q, dtype=y.dtype, device=y.device)
    scalars = _scalars(float(damping), 1.0 if omega is None else float(omega), y)
    block_q = min(64, max(16, triton.next_power_of_2(q)))
    grid = (triton.cdiv(n, block_rows), triton.cdiv(q, block_q))
    _ppr_step_kernel[grid](
        matrix.crow_indices(), matrix.col_indices(), matrix.values(), y, y_prev, base, g, res,
        mass, scalars, n, q,
        BLOCK_R=block_rows, BLOCK_Q=block_q, LERP=omega is not None, MEASURE=measure,
    )
    return (res, mass) if measure else None


_SCALARS: dict[tuple, Tensor] = {}


def _scalars(damping: float, omega: float, like: Tensor) -> Tensor:
    """[d, ω] on the device, made once per value (a host-to-device copy per step would break
    CUDA-graph capture, and the ω sequence of a solve repeats across calls)."""
    key = (damping, omega, like.dtype, like.device)
    found = _SCALARS.get(key)
    if found is None:
        found = _SCALARS[key] = torch.tensor([damping, omega], dtype=like.dtype, device=like.device)
    return found


def make_step(matrix: Tensor, damping: float):
    """:data:`hippo_gpu.ppr.StepFn` running :func:`ppr_step` on ``matrix``."""

    def step(base, y, y_prev, g, omega, measure):
        return ppr_step(matrix, damping, base, y, y_prev, g, omega, measure)

    return step
