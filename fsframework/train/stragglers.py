"""Which rank is slow (docs/training.md, "Stragglers").

In data- and sequence-parallel training every step ends when the slowest rank's does: the others
wait for it in the collectives (the gradient reduction, the sequence-parallel exchanges). So a
rank's step time says little; its busy time does: the step's seconds less those it spent in the
timed collectives (`fsframework.train.throughput.CollectiveLap`), where the waiting is. A slow rank
(a throttled GPU, a noisy neighbour, a slow disk) waits least and is busy longest.

On every logged step each rank's busy seconds are gathered (a `[world]` all-gather; every rank logs
the same steps) and the record gets `rank_busy_s_min`, `rank_busy_s_max` and `rank_slowest`. A rank
busy at least `train.straggler_factor` times the median of the others' for `train.straggler_intervals`
logged steps in a row is named in one warning line, once per such streak. Under ZeRO-3 the gradient
reduction runs inside the backward's hooks, untimed: there a rank's waiting counts as busy, and the
figures understate the gap.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class StragglerWatch:
    """Turns each logged step's busy seconds per rank into record fields and, at most once per streak,
    a warning (module docstring). `factor` 0: no warnings."""

    factor: float
    intervals: int
    rank: Optional[int] = None  # the rank of the current streak
    streak: int = 0
    warned: bool = False

    def observe(self, step: int, busy: list[float]) -> tuple[dict[str, float], Optional[str]]:
        """(the record's fields, a warning line or None) for step `step`'s busy seconds of every rank."""
        slowest = max(range(len(busy)), key=busy.__getitem__)
        fields = {"rank_busy_s_min": min(busy), "rank_busy_s_max": busy[slowest], "rank_slowest": slowest}
        others = statistics.median(b for r, b in enumerate(busy) if r != slowest) if len(busy) > 1 else 0.0
        if not self.factor or others <= 0 or busy[slowest] < self.factor * others:
            self.rank, self.streak, self.warned = None, 0, False
            return fields, None
        if slowest != self.rank:
            self.rank, self.streak, self.warned = slowest, 0, False
        self.streak += 1
        if self.streak < self.intervals or self.warned:
            return fields, None
        self.warned = True
        return fields, (f"rank {slowest} is a straggler: busy {busy[slowest]:.3g} s a step against the other ranks' "
                        f"{others:.3g} s ({busy[slowest] / others:.1f}x) for {self.streak} logged steps up to step "
                        f"{step}; the others wait for it in every collective")


def gather_busy_seconds(seconds: float, device: torch.device, world_size: int) -> list[float]:
    """Every rank's busy seconds of this step (one all-gather; `[seconds]` on one process)."""
    if world_size == 1:
        return [seconds]
    import torch.distributed as dist

    mine = torch.tensor([seconds], dtype=torch.float64, device=device)
    every = [torch.zeros_like(mine) for _ in range(world_size)]
    dist.all_gather(every, mine)
    return [float(t.item()) for t in every]
