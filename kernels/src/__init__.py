"""Optional fused PPR kernels behind :mod:`hippo_gpu.ppr`, shipped as ``hippo_gpu.kernels``.

* ``ppr_cpu`` (numba): the fused, cache-blocked CPU solve; the default CPU backend of
  :class:`hippo_gpu.ppr.PPRSolver` when ``AVAILABLE``.
* ``ppr_triton`` (Triton): one fused PPR step on CUDA, opt-in (``USE_TRITON`` or
  ``PPRSolver(kernel="triton")``) until a GPU run shows it faster than cuSPARSE.
* ``compact_cpu`` (numba): the int8 first pass of a lone query's fact scan, behind
  :mod:`hippo_gpu.retrieval.compact_facts`.
* ``topk_cpu`` (numba): insertion-buffer top-k, behind the synonym join
  (:func:`hippo_gpu.indexing.cosine_join.nearest_lists`) and the one-pass fact top-k
  (:func:`hippo_gpu.retrieval.seeds.fact_topk`) on the CPU when ``AVAILABLE``.

The flags are computed once, at import: ``AVAILABLE`` is whether the numba kernel imports (a
failure is logged once and leaves it False); ``HIPPO_GPU_FORCE_TORCH=1`` keeps every solver on the
torch path; ``HIPPO_GPU_PPR_TRITON=1`` turns the Triton step on for CUDA solvers. Triton itself
is imported only when a Triton solver is built. See README.md.
"""

from __future__ import annotations

import logging
import os

__all__ = ["AVAILABLE", "FORCE_TORCH", "USE_TRITON"]

_log = logging.getLogger(__name__)


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


FORCE_TORCH: bool = _flag("HIPPO_GPU_FORCE_TORCH")
USE_TRITON: bool = _flag("HIPPO_GPU_PPR_TRITON")

try:
    from hippo_gpu.kernels import ppr_cpu  # noqa: F401  (numba; JIT-compiles on first use)

    AVAILABLE: bool = True
except ImportError as e:  # numba missing or broken: the torch path serves every call
    _log.warning("hippo_gpu.kernels: numba PPR kernel unavailable (%s); using torch", e)
    AVAILABLE = False
