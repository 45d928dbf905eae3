"""The only place that turns a device spec ("auto", "cpu", "cuda", "cuda:1") into a torch.device."""

from __future__ import annotations

import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(spec: str | torch.device | None = "auto") -> torch.device:
    """Resolve a user-facing device spec.

    "auto" (or None) picks CUDA when it is available, else the CPU. Asking for CUDA on a machine
    without it is an error rather than a silent fallback.
    """
    if isinstance(spec, torch.device):
        device = spec
    elif spec is None or spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            device = torch.device(spec)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"unknown device {spec!r}; use one of {DEVICE_CHOICES}") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} was requested but CUDA is not available")
    return device


def set_threads(threads: int | None) -> int:
    """Set torch's intra-op thread count (None keeps the current one); return the count in use."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    return torch.get_num_threads()


# Precision of the device-resident embeddings and of the scores computed from them. One default
# on every device: float32 (it reproduces the official figures); half precision only on request.
PRECISIONS = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def precision_dtype(precision: str) -> torch.dtype:
    """The torch dtype of a precision name ("float32", "float16" or "bfloat16")."""
    try:
        return PRECISIONS[precision]
    except KeyError:
        raise ValueError(f"unknown precision {precision!r}; use one of {tuple(PRECISIONS)}") \
            from None


def ppr_dtype(name: str) -> torch.dtype:
    """The torch dtype of a PPR precision name (RetrievalConfig.dtype: "float32" | "float64")."""
    if name not in ("float32", "float64"):
        raise ValueError(f"PPR dtype must be 'float32' or 'float64', got {name!r}")
    return torch.float64 if name == "float64" else torch.float32
