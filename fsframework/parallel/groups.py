"""Process groups for data x sequence parallelism.

World ranks are laid out SP-major: ranks `[g*sp, (g+1)*sp)` form sequence-parallel
group `g` (consecutive ranks, matching mosaicml-streaming's `replication`, which
hands consecutive ranks the same samples). Data-parallel group `j` holds the
ranks with index `j` inside their SP group: `{j, j + sp, j + 2 sp, ...}`.

DeepSpeed still sees every rank as a data-parallel replica and averages
gradients over the whole world; the sequence-parallel loss scaling in
`fsframework.parallel.batch` makes that average equal the data-parallel average of
full-sequence gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional
from fsframework.config import check_world_size


@dataclass
class ParallelGroups:
    """Where this rank sits: `sp_rank` in SP group `dp_rank` (one SP group per DP replica)."""

    rank: int
    world_size: int
    sp: int
    sp_group: Any  # torch ProcessGroup of this rank's SP group (None when sp == 1)
    dp_group: Any  # ProcessGroup of this rank's DP group (None when dp == 1)

    @property
    def dp(self) -> int:
        return self.world_size // self.sp

    @property
    def sp_rank(self) -> int:
        return self.rank % self.sp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.sp

    @property
    def sp_ranks(self) -> list[int]:
        """Global ranks of this rank's SP group, in SP order."""
        first = self.dp_rank * self.sp
        return list(range(first, first + self.sp))


def init_groups(sp: int, timeout_s: Optional[int] = None, backend: Optional[str] = None) -> ParallelGroups:
    """Create the SP and DP groups (collective: every rank of the world must call it).

    timeout_s: collective timeout of the new groups (`parallel.timeout_s`); torch's
    default for new groups is 30 minutes whatever the default group uses, so a hung
    peer would otherwise stall an SP collective that long.

    `torch.distributed.new_group` must be called by all ranks for every group, in the
    same order, so each rank creates all groups and keeps the two it belongs to.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("init_groups needs an initialised default process group")
    from datetime import timedelta

    world, rank = dist.get_world_size(), dist.get_rank()
    dp = check_world_size(world, sp)
    timeout = timedelta(seconds=timeout_s) if timeout_s else None
    sp_group = dp_group = None
    for g in range(dp):
        group = dist.new_group(list(range(g * sp, (g + 1) * sp)), timeout=timeout, backend=backend) if sp > 1 else None
        if rank // sp == g:
            sp_group = group
    for j in range(sp):
        group = dist.new_group(list(range(j, world, sp)), timeout=timeout, backend=backend) if dp > 1 else None
        if rank % sp == j:
            dp_group = group
    return ParallelGroups(rank=rank, world_size=world, sp=sp, sp_group=sp_group, dp_group=dp_group)
