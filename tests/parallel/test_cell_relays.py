"""The cell plan with relays (fsframework.parallel.cell_relays), on plans shaped like FS-L's and
like FS's under the zigzag layout (owners after their targets): every target still receives
exactly its cells, a relay forwards only cells it received straight from their owner, and the
busiest rank receives no more; on FS-L's, from sp = 4 on, less and within 10% of the mean, the
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



def zigzag_fs_like_plan(sp: int, cells_per_run: int, call: int, heads: int = 3, frac: float = 0.3, seed: int = 0):
    """FS's requests in one layer call under the zigzag layout: rank r holds runs r and 2 sp - 1 - r
    and calls the layer once per run (`call` 0: its first run, 1: its second); each run reads a random
    `frac` of the earlier cells other ranks hold, so an owner may come after its target in rank order
    (in call 1, rank sp - 1's first run precedes rank 0's second)."""
    gen = torch.Generator().manual_seed(seed)
    owner_of_run = torch.tensor([r if r < sp else 2 * sp - 1 - r for r in range(2 * sp)])
    plan = {}
    for target in range(sp):
        run = target if call == 0 else 2 * sp - 1 - target
        wanted = (torch.rand(2, heads, run * cells_per_run, generator=gen) < frac).nonzero()
        owners = owner_of_run[wanted[:, 2] // cells_per_run]
        for owner in range(sp):
            mine = wanted[owners == owner]
            if owner != target and len(mine):
                plan[(owner, target)] = mine
    return plan


@pytest.mark.parametrize("sp", [2, 4, 8])
@pytest.mark.parametrize("call", [0, 1])
def test_relays_under_zigzag_keep_every_fetch(sp, call):
    # owners after their targets, relays on either side: each target still gets each of its cells once,
    # from its owner or from a rank that received it straight from that owner
    direct = zigzag_fs_like_plan(sp, 16, call)
    assert call == 0 or any(owner > target for owner, target in direct)
    plan = balance(direct, sp)
    for target in range(sp):
        want = [rows for (_, t), rows in direct.items() if t == target]
        got = plan.rows_of(target)
        assert sum(map(len, got)) == sum(map(len, want))
        if want:
            assert as_set(torch.cat(got)) == as_set(torch.cat(want))
        for relay, rows in plan.received_by(target, relayed=True):
            first = torch.cat([r for _, r in plan.received_by(relay)])
            assert torch.equal(first[plan.sources[(relay, target)]], rows)
    before, after = CellPlan(direct).loads(sp), plan.loads(sp)
    assert sum(after) == sum(before) and max(after) <= max(before)
