"""Query x embedding scores in blocks whose bits do not depend on the blocking.

Retrieval scores Q queries against F facts, P passages or M phrases; at a million passages a
whole [Q, F] product no longer fits (F ~ 9M: 9 GB at Q = 256 in float32), so
hippo_gpu.retrieval.searcher takes it in blocks of embedding rows and of queries. For the results to
be those of the whole product, each block must give the same bits as the whole would. BLAS promises
no such thing: MKL picks its kernel and its split of the work between threads from the whole shape,
and measured on two CPUs (torch 2.13's MKL, 2 threads) the bits moved with the shape in different
ways: on an AVX2 AMD EPYC, blocks of 256 rows matched the whole product, while on an AVX-512 Intel
Xeon a [40, 384] x [384, 2000] product differed from its 1024-row blocks and 8-query panels differed
from the 40-query product at 1 thread (up to 1.6e-7).

So on the CPU the product is never one GEMM of the caller's shape: `scores_against` computes
every [A, B] product as GEMMs of one fixed shape, [QUERY_PANEL, D] x [D, ROW_ALIGN] (query rows
padded with zeros to a full panel; the last slab of embedding rows is what is left of it).
Whatever the batch or the block, a query's score against row j comes from the same GEMM shape
on the same operands: bit-identical by construction, on any CPU, as long as blocks of embedding
rows start at multiples of ROW_ALIGN (block_rows guarantees it) and query chunks at multiples of
QUERY_PANEL. The cost is one small GEMM per panel and slab (~2 s per 256 queries x 9M facts
here, against minutes for the rest of such a batch).

On CUDA (cuBLAS picks kernels by shape) one GEMM is used and blocks agree to float32
round-off, not bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

__all__ = ["QUERY_PANEL", "ROW_ALIGN", "block_rows", "nearest_rows", "panel_slabs",
           "scores_against", "spans"]

QUERY_PANEL = 8  # query rows per GEMM (the batch is padded to a multiple of this)
ROW_ALIGN = 1024  # embedding rows per GEMM; embedding-row blocks start at multiples of this


def scores_against(queries: Tensor, emb: Tensor) -> Tensor:
    """[A, D] query vectors x [B, D] embedding rows -> [A, B] dot products in `emb`'s dtype.

    On the CPU, one [QUERY_PANEL, D] x [D, ROW_ALIGN] GEMM per query panel and embedding slab
    (`panel_slabs`; see the module docstring): entry (i, j) does not depend on the other rows or
    on how the caller blocked the embedding rows (at multiples of ROW_ALIGN). On CUDA, one GEMM.
    """
    x = queries.to(emb.device, emb.dtype)
    a, b = x.shape[0], emb.shape[0]
    if emb.device.type != "cpu":
        return x @ emb.T
    out = torch.empty((a, b), dtype=emb.dtype)
    for c, block in panel_slabs(x, emb):
        out[:, c:c + block.shape[1]] = block[:a]
    return out


def panel_slabs(queries: Tensor, emb: Tensor) -> Iterator[tuple[int, Tensor]]:
    """CPU: (c, [A', R] scores of every query against emb[c:c + R]) per slab of ROW_ALIGN rows.

    A' is A padded with zero queries to a multiple of QUERY_PANEL (rows past A are padding).
    The slabs come in ascending order, each read once for all query panels (slab outer, panels
    inner: a [R, D] slab stays in L2 while its panels are multiplied), and every panel is the
    one GEMM shape of `scores_against`, so each score has its bits. The yielded block is a
    buffer reused by the next slab: use it before asking for the next one.

    Args:
        queries: [A, D] in emb's dtype, on the CPU.
        emb: [B, D] embedding rows on the CPU.
    """
    a, d = queries.shape
    pad = (-a) % QUERY_PANEL
    x = torch.cat([queries, queries.new_zeros((pad, d))]) if pad else queries
    buf = torch.empty((a + pad, ROW_ALIGN), dtype=emb.dtype)
    for c in range(0, emb.shape[0], ROW_ALIGN):
        slab_t = emb[c:c + ROW_ALIGN].T  # [D, R]
        rows = slab_t.shape[1]
        block = buf if rows == ROW_ALIGN else buf.new_empty((a + pad, rows))  # contiguous
        for r in range(0, a + pad, QUERY_PANEL):
            torch.mm(x[r:r + QUERY_PANEL], slab_t, out=block[r:r + QUERY_PANEL])  # the one shape
        yield c, block


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
