"""Optional fused PPR kernels (Triton/CUDA), shipped as ``hippo_gpu.kernels``.

No kernel ships yet, so ``AVAILABLE`` is False and :mod:`hippo_gpu.ppr` always takes its torch
path (cuSPARSE on CUDA, MKL on the CPU). The flag is computed once at import; setting
``HIPPO_GPU_FORCE_TORCH=1`` will keep the torch path even once a kernel exists. See README.md.
"""

from __future__ import annotations

import os

FORCE_TORCH: bool = os.environ.get("HIPPO_GPU_FORCE_TORCH", "") not in ("", "0")
AVAILABLE: bool = False  # no kernel is built or tested on CUDA yet

__all__ = ["AVAILABLE", "FORCE_TORCH"]
