"""The one timing helper every benchmark uses.

Warm-up calls are excluded from the statistics, the first call is reported on its own (it carries
allocation, lazy init and compile time), CUDA is synchronised around every timed call, and the
summary is the median with the 20th and 80th percentiles. Samples timed some other way (a stream
of distinct calls, interleaved providers) are summarised by the same :func:`summarize`.

torch is imported only when a CUDA device is named, so importing this module (through
benchmarks.common) before the thread environment is set costs nothing and loads no BLAS.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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


def _is_cuda(device: torch.device | str | None) -> bool:
    if device is None:
        return False
    import torch

    return torch.device(device).type == "cuda"


def _sync(device: torch.device | str | None) -> None:
    if _is_cuda(device):
        import torch

        torch.cuda.synchronize(device)


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default method) of `values`, 0 <= q <= 1."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(first: float, samples: Sequence[float]) -> Timing:
    """A :class:`Timing` of recorded `samples` (seconds; at least one), `first` reported apart."""
    if not samples:
        raise ValueError("summarize needs at least one sample")
    return Timing(first=first, median=statistics.median(samples), p20=quantile(samples, 0.2),
                  p80=quantile(samples, 0.8), runs=len(samples))


def time_call(
    fn: Callable[[], object],
    *,
    device: torch.device | str | None = None,
    warmup: int = 1,
    repeats: int = 5,
    max_seconds: float | None = None,
    events: bool = False,
) -> Timing:
    """Time ``fn()``.

    Args:
        fn: the call to time (no arguments).
        device: synchronised before and after each call when it is a CUDA device.
        warmup: calls after the first one that are run but not recorded.
        repeats: recorded calls (at least 1).
        max_seconds: stop recording early once this much time was spent (keeps >= 1 run).
        events: on a CUDA `device`, time each call with two CUDA events on the current stream
            (device time between them: no host-side synchronisation cost, which matters for
            calls of microseconds); ignored elsewhere (host clock).

    Returns:
        :class:`Timing` in seconds.
    """
    if events and _is_cuda(device):
        import torch

        def timed() -> float:
            start, stop = (torch.cuda.Event(enable_timing=True),
                           torch.cuda.Event(enable_timing=True))
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop) / 1e3
    else:

        def timed() -> float:
            start = time.perf_counter()
            fn()
            _sync(device)
            return time.perf_counter() - start

    _sync(device)
    first = timed()
    for _ in range(warmup):
        fn()
    _sync(device)
    samples: list[float] = []
    spent = 0.0
    for _ in range(max(1, repeats)):
        samples.append(timed())
        spent += samples[-1]
        if max_seconds is not None and spent >= max_seconds:
            break
    return summarize(first, samples)
