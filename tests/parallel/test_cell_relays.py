"""FS-L's cell plan with relays (fsframework.parallel.cell_relays), on plans shaped like FS-L's:
every target still receives exactly its cells, a relay forwards only cells it received straight
from their owner, and the busiest rank receives less: from sp = 4 on, within 10% of the mean, the
last rank taking gradients as a relay (real ranks: tests/parallel/test_sp_retained.py)."""

from __future__ import annotations

import pytest
import torch

from fsframework.parallel.cell_relays import CellPlan, balance


def fsl_like_plan(sp: int, cells_per_rank: int, top: int = 16, halo: int = 4, heads: int = 3, seed: int = 0):
    """The direct plan of FS-L's fetch for random key-norm priorities: every rank t >= 1 fetches its
    `halo` cells before its slice and the top-`top` cells of the rest of its prefix, each from its owner."""
    gen = torch.Generator().manual_seed(seed)
    priority = torch.rand(2, heads, sp * cells_per_rank, generator=gen)
    plan = {}
    for target in range(1, sp):
        start = target * cells_per_rank
        low = max(0, start - halo)
        best = priority[..., :start].argsort(-1, descending=True)[..., :top]
        wanted = torch.zeros(2, heads, start, dtype=torch.bool)
        wanted.scatter_(-1, best, True)
        wanted[..., low:] = True
        rows = wanted.nonzero()  # (b, h, cell)
        for owner in range(target):
            mine = rows[rows[:, 2] // cells_per_rank == owner]
            if len(mine):
                plan[(owner, target)] = mine
    return plan


def as_set(rows: torch.Tensor) -> set:
    return set(map(tuple, rows.tolist()))


@pytest.mark.parametrize("sp,cells_per_rank", [(4, 16), (4, 256), (8, 8), (8, 128), (2, 64)])
def test_relays_keep_every_fetch_and_lower_the_busiest_rank(sp, cells_per_rank):
    direct = fsl_like_plan(sp, cells_per_rank)
    plan = balance(direct, sp)
    for target in range(1, sp):
        got = torch.cat(plan.rows_of(target))
        want = torch.cat([rows for (_, t), rows in direct.items() if t == target])
        assert len(got) == len(want) and as_set(got) == as_set(want)  # each cell once, the same cells
        for relay, rows in plan.received_by(target, relayed=True):
            # a relay sends cells it received in round 1, straight from their owner
            first = torch.cat([r for _, r in plan.received_by(relay)])
            assert torch.equal(first[plan.sources[(relay, target)]], rows)
    before, after = CellPlan(direct).loads(sp), plan.loads(sp)
    assert sum(after) == sum(before)  # a relay moves a gradient's receipt, it does not add one
    assert max(after) <= max(before)
    if sp >= 4:
        assert plan.relayed and max(after) < max(before)  # FS-L's middle ranks are the busiest: relays help
        # the last rank serves no cell of its own: it evens the load out by relaying earlier ranks' cells,
        # to targets before it too, and receives their gradients
        assert any(relay == sp - 1 for relay, _ in plan.relayed)
        assert after[sp - 1] > before[sp - 1]
        assert max(after) <= 1.1 * sum(after) / sp


def test_two_ranks_need_no_relay():
    direct = fsl_like_plan(2, 32)
    plan = balance(direct, 2)
    assert not plan.relayed and plan.direct.keys() == direct.keys()
