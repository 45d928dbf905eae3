"""Query x embedding scores in blocks whose bits do not depend on the blocking.

Retrieval scores Q queries against F facts, P passages or M phrases with one GEMM each; at a
million passages a whole [Q, F] product no longer fits (F ~ 9M: 9 GB at Q = 256 in float32), so
hippo_gpu.search takes it in blocks of embedding rows and of queries. For the results to be
those of the whole product, each block must give the same bits as the whole GEMM would. BLAS
promises no such thing; what we rely on, and test (tests/test_chunked_search.py), on the CPU:

* Query rows padded with zeros to a multiple of QUERY_PANEL (8) all run through the same
  full-panel micro-kernel, so a query's scores are bit-identical alone, in any batch and in any
  chunk of queries. Unpadded, the rows of a short tail panel (Q mod 8) and batches of 1-2 rows
  take other kernels and differ in the last bit (MKL, measured: up to 2.4e-7).
* Blocks of embedding rows that start at multiples of ROW_ALIGN (256) give the bits of the whole
  product (measured: blocks of 16 rows do not; 64 and up do).

On CUDA (cuBLAS picks kernels by shape) blocks agree to float32 round-off, not bit for bit.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["QUERY_PANEL", "ROW_ALIGN", "block_rows", "nearest_rows", "scores_against", "spans"]

QUERY_PANEL = 8  # query rows of every GEMM are padded to a multiple of this
ROW_ALIGN = 256  # embedding-row blocks start at multiples of this


def scores_against(queries: Tensor, emb: Tensor) -> Tensor:
    """[A, D] query vectors x [B, D] embedding rows -> [A, B] dot products in `emb`'s dtype.

    The query rows are padded with zero rows to a multiple of QUERY_PANEL before the GEMM (see
    the module docstring): row i of the result does not depend on the other rows.
    """
    x = queries.to(emb.device, emb.dtype)
    a = x.shape[0]
    pad = (-a) % QUERY_PANEL
    if pad:
        x = torch.cat([x, x.new_zeros((pad, x.shape[1]))])
    return (x @ emb.T)[:a]


def spans(total: int, size: int) -> list[tuple[int, int]]:
    """[(start, stop)] blocks of `size` covering range(total) (one empty span when total = 0)."""
    size = max(1, size)
    return [(a, min(a + size, total)) for a in range(0, total, size)] or [(0, 0)]


def block_rows(total: int, bytes_per_row: int, budget: int) -> int:
    """Rows per block so that a block's working set stays within `budget` bytes.

    All `total` rows when they fit (one block, the unblocked computation); else the largest
    multiple of ROW_ALIGN that fits, and at least ROW_ALIGN.
    """
    if total * bytes_per_row <= budget:
        return max(total, 1)
    return max(ROW_ALIGN, budget // max(bytes_per_row, 1) // ROW_ALIGN * ROW_ALIGN)


def nearest_rows(queries: Tensor, emb: Tensor, rows_per_block: int | None = None) -> Tensor:
    """[E, D] vectors x [M, D] rows -> [E] int64 row of the largest dot product (first on ties).

    Blocks of `rows_per_block` embedding rows hold at most [E, rows_per_block] scores; a running
    maximum replaces the best row only on a strictly larger score, so the first maximum wins as
    in `argmax` over the whole row.
    """
    m = emb.shape[0]
    e = queries.shape[0]
    if m == 0:
        raise ValueError("nearest_rows needs at least one embedding row")
    size = m if rows_per_block is None else max(1, min(rows_per_block, m))
    best_val: Tensor | None = None
    best_row = torch.zeros(e, dtype=torch.int64, device=emb.device)
    for a, b in spans(m, size):
        scores = scores_against(queries, emb[a:b])  # [E, b - a]
        row = scores.argmax(dim=1)  # the first maximum within the block
        val = scores.gather(1, row.unsqueeze(1)).squeeze(1)
        if best_val is None:
            best_val, best_row = val, row + a
            continue
        better = val > best_val  # strict: an equal score in a later block keeps the earlier row
        best_val = torch.where(better, val, best_val)
        best_row = torch.where(better, row + a, best_row)
    return best_row
