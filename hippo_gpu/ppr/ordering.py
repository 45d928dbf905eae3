"""Node orderings for the PPR operator: reverse Cuthill–McKee, and a CSR permuted by one.

The numba kernel gathers y rows along each CSR row; with neighbours numbered close together
those gathers stay in cache (hippo_gpu.kernels.ppr_cpu). Both functions run on the CPU (scipy).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["permute_csr", "rcm_permutation"]


def rcm_permutation(adjacency: Tensor) -> Tensor:
    """Reverse Cuthill–McKee order of a symmetric CSR graph (scipy), as an [N] int64 permutation.

    ``perm[k]`` is the original node placed at position k; it clusters neighbours in memory.
    """
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    a = adjacency.to("cpu")
    n = a.shape[0]
    graph = csr_matrix(
        (
            np.ones(a.values().numel(), dtype=np.int8),
            a.col_indices().numpy(),
            a.crow_indices().numpy(),
        ),
        shape=(n, n),
    )
    perm = reverse_cuthill_mckee(graph, symmetric_mode=True)
    return torch.from_numpy(np.ascontiguousarray(perm, dtype=np.int64))


def permute_csr(adjacency: Tensor, perm: Tensor) -> Tensor:
    """Return A[perm][:, perm] as CSR (on the CPU, via scipy)."""
    from scipy.sparse import csr_matrix

    a = adjacency.to("cpu")
    n = a.shape[0]
    sp = csr_matrix(
        (a.values().numpy(), a.col_indices().numpy(), a.crow_indices().numpy()), shape=(n, n)
    )
    p = perm.numpy()
    sp = sp[p][:, p].tocsr()
    sp.sort_indices()
    return torch.sparse_csr_tensor(
        torch.from_numpy(sp.indptr.astype(np.int64)),
        torch.from_numpy(sp.indices.astype(np.int64)),
        torch.from_numpy(sp.data),
        (n, n),
        check_invariants=False,
    )
