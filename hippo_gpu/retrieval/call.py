"""One rank call's settings and instruments, fixed once when the call starts.

`Searcher.rank` resolves what a call needs once (the retrieval settings, the mode as a value, the
chunk plan) and creates its instruments once (the stage timer; the capture `explain` reads),
then hands the one `RankCall` to every stage instead of five loose arguments each.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from hippo_gpu.config import RetrievalConfig
from hippo_gpu.retrieval.explain import Capture
from hippo_gpu.retrieval.modes import Mode
from hippo_gpu.retrieval.ranking import topk_stable
from hippo_gpu.retrieval.seeds import ChunkPlan

__all__ = ["Clock", "RankCall"]


class Clock:
    """The stage timer of a rank call (`Ranking.stage_seconds`). With ``sync``
    (SearcherOptions.profile) it synchronises CUDA at each lap so each stage is charged its own
    work; without, a served GPU query pays no syncs and the laps only split the host time (the
    total is still right)."""

    def __init__(self, device: torch.device, *, sync: bool = False) -> None:
        self.sync = sync and device.type == "cuda"
        self.device = device
        self.seconds: dict[str, float] = {}
        self.t = time.perf_counter()

    def lap(self, name: str) -> None:
        """Charge the time since the last lap to stage ``name`` (stages add up)."""
        if self.sync:
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.t
        self.t = now


@dataclass(frozen=True)
class RankCall:
    """What every stage of one rank call reads.

    Attributes:
        queries: the call's queries, checked.
        top_k: passages returned per query.
        mode: the retrieval mode (hippo_gpu.retrieval.modes), looked up once.
        cfg: the retrieval settings of this call (the Searcher's unless the call overrides).
        plan: the chunk plan of this call (hippo_gpu.retrieval.seeds.plan_chunks), made once.
        clock: the call's stage timer.
        capture: what `explain` records of the ranking (a pass-through for a plain rank).
        allowed: the passage rows a metadata filter keeps, ascending, on the index device
            (None: no filter). The filter acts on the final scores (`top`), after the PPR.
    """

    queries: list[str]
    top_k: int
    mode: Mode
    cfg: RetrievalConfig
    plan: ChunkPlan
    clock: Clock
    capture: Capture
    allowed: Tensor | None = None

    def top(self, scores: Tensor) -> tuple[Tensor, Tensor]:
        """([c, k] scores, [c, k] passage rows) of the call's top_k among `scores` [c, P]: all
        passages, or only the `allowed` ones (then k is at most their number). Both select
        with topk_stable over ascending rows, so ties go to the lower passage row either way
        and a filtered hit keeps the score and relative order it has in the unfiltered
        ranking."""
        if self.allowed is None:
            return topk_stable(scores, self.top_k)
        vals, idx = topk_stable(scores[:, self.allowed], self.top_k)
        return vals, self.allowed[idx]
