"""The one timing helper every benchmark uses.

Warm-up calls are excluded from the statistics, the first call is reported on its own (it carries
allocation, lazy init and compile time), CUDA is synchronised around every timed call, and the
summary is the median with the 20th and 80th percentiles.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Timing:
    """Seconds per call."""

    first: float  # the first call (cold), not part of the statistics
    median: float
    p20: float
    p80: float
    runs: int

    def as_dict(self, scale: float = 1e3, suffix: str = "_ms") -> dict[str, float]:
        """Values scaled (default: milliseconds) with keys suffixed, plus ``runs``."""
        out: dict[str, Any] = {
            k + suffix: v * scale for k, v in asdict(self).items() if k != "runs"
        }
        out["runs"] = self.runs
        return out


def _sync(device: torch.device | str | None) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted list."""
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def time_call(
    fn: Callable[[], object],
    *,
    device: torch.device | str | None = None,
    warmup: int = 1,
    repeats: int = 5,
    max_seconds: float | None = None,
) -> Timing:
    """Time ``fn()``.

    Args:
        fn: the call to time (no arguments).
        device: synchronised before and after each call when it is a CUDA device.
        warmup: calls after the first one that are run but not recorded.
        repeats: recorded calls (at least 1).
        max_seconds: stop recording early once this much time was spent (keeps >= 1 run).

    Returns:
        :class:`Timing` in seconds.
    """
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    first = time.perf_counter() - start
    for _ in range(warmup):
        fn()
    _sync(device)
    samples: list[float] = []
    spent = 0.0
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - start)
        spent += samples[-1]
        if max_seconds is not None and spent >= max_seconds:
            break
    samples.sort()
    return Timing(
        first=first,
        median=statistics.median(samples),
        p20=_quantile(samples, 0.2),
        p80=_quantile(samples, 0.8),
        runs=len(samples),
    )
