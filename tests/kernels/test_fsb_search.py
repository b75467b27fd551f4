"""FS-B's beam-search kernel (fsf_kernels.fsb_search) against the PyTorch search it replaces.

The kernel places the found cells in slots of its own; the search's result is the set per
(forest row, query), so sets are compared. Forests grow as in a sequence: a few cells per
block boundary, rows keeping different cells (as `F0` and `Ftau` do), one row empty.
"""

from __future__ import annotations

import pytest
import torch

from fsframework.models.freesolo_settings import fs_config, fs_pair, fs_prior
from fsframework.ops.freesolo import select_cells
from fsframework.ops.fsb_forest import Forests
from fsframework.ops.fsb_search import beam_search
from kernel_testing import kernel_launches
from tests.work import WorkCounter

F32, F64 = torch.float32, torch.float64


def grown_forests(rows: int, cells: int, dim: int, dtype, *, seed: int, same_cells: bool = False,
                  device: str = "cpu") -> Forests:
    """Forests of `rows` rows over `cells` cells admitted 4 at a time; row r keeps a fraction
    1, 1/2, 1/4 of them by turns, and the last row none (an empty forest)."""
    gen = torch.Generator().manual_seed(seed)
    if same_cells:  # every cell alike: equal bounds wherever the prior's gate is saturated
        kbar = torch.ones(rows, cells, dim, dtype=dtype)
        a = torch.ones(rows, cells, dtype=dtype)
    else:
        kbar = torch.randn(rows, cells, dim, generator=gen, dtype=dtype)
        a = torch.rand(rows, cells, generator=gen, dtype=dtype) * 3
    centers = (torch.arange(cells, dtype=dtype) + 0.5) * 16
    share = torch.tensor([(1.0, 0.5, 0.25)[r % 3] for r in range(rows)])
    keep = torch.rand(rows, cells, generator=gen) < share[:, None]
    keep[-1] = False
    kbar, a, centers, keep = (t.to(device) for t in (kbar, a, centers, keep))
    forests = Forests(rows, dim, dtype=dtype, device=device)
    for lo in range(0, cells, 4):
        hi = min(lo + 4, cells)
        forests.admit(kbar[:, lo:hi], a[:, lo:hi], centers[lo:hi], torch.arange(lo, hi, device=device),
                      keep[:, lo:hi])
    return forests


def search(forests: Forests, q, pos, lam, sigma, impl: str, beam_width: int, bound_c: float = 8.0):
    return beam_search(forests.store, forests.root, q, pos,
                       fs_config(beam_width=beam_width, bound_c=bound_c, impl=impl), fs_prior(lam=lam, sigma=sigma))


def as_sets(cells: torch.Tensor) -> torch.Tensor:
    return cells.sort(dim=-1).values


@pytest.mark.parametrize("dtype,rows,cells,dim,queries,beam_width", [
    (F32, 4, 64, 32, 4, 16),  # beams that drop nodes, rows of 64, 32, 16 and 0 cells
    (F32, 3, 150, 24, 3, 6),  # a beam width and head dim that are not powers of two
    (F32, 2, 40, 16, 2, 1),  # a beam of one node: a greedy descent
    (F32, 3, 12, 16, 2, 16),  # every node fits: the beam keeps them all
    (F64, 4, 64, 32, 3, 8),
])
def test_kernel_finds_the_reference_cells(dtype, rows, cells, dim, queries, beam_width, device):
    forests = grown_forests(rows, cells, dim, dtype, seed=cells, device=device)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(rows, queries, dim, generator=gen, dtype=dtype).to(device)
    pos = torch.arange(cells * 16, cells * 16 + queries, dtype=dtype, device=device)
    lam = (torch.rand(rows, generator=gen, dtype=dtype) + 0.5).to(device)
    sigma = (torch.rand(rows, generator=gen, dtype=dtype) * 40 + 1.0).to(device)  # the gate varies over the cells
    want = search(forests, q, pos, lam, sigma, "reference", beam_width)
    got = search(forests, q, pos, lam, sigma, "triton", beam_width)
    assert got.shape == want.shape and got.dtype == torch.long
    assert torch.equal(as_sets(got), as_sets(want))
    found = (want >= 0).sum(dim=-1)
    assert int(found[-1].max()) == 0  # the empty forest finds nothing
    assert int(found[0].min()) == min(beam_width, int(forests.count[0]))  # a full row fills the beam


def test_equal_bounds_go_to_the_smaller_pmin(device):
    """Identical cells with a saturated gate: every node's bound is the same, so which nodes a beam
    keeps is decided by the tie rule alone (the earlier subtree, smaller `pmin_v`, first)."""
    rows, cells, dim, beam_width = 3, 48, 16, 8
    forests = grown_forests(rows, cells, dim, F32, seed=0, same_cells=True, device=device)
    q = torch.ones(rows, 2, dim, device=device)
    pos = torch.full((2,), 1e6, device=device)  # erf((i - pmin) / 2 sigma) == 1 exactly for every node
    lam, sigma = torch.ones(rows, device=device), torch.ones(rows, device=device)
    want = search(forests, q, pos, lam, sigma, "reference", beam_width)
    got = search(forests, q, pos, lam, sigma, "triton", beam_width)
    assert torch.equal(as_sets(got), as_sets(want))
    # row 0 keeps all 48 cells: chunks of 32 and 16, whose equal cells split in arrival order. Every
    # level that overflows the beam keeps the smallest pmin_v, and no leaf is reached before the
    # last level, so the beam ends on the 8 earliest cells
    assert int(forests.count[0]) == cells
    assert torch.equal(as_sets(got[0]).cpu(), torch.arange(beam_width).expand(2, -1))


@pytest.mark.parametrize("forests", ["both", "ftau"])
def test_fsb_routing_with_the_kernel_equals_the_reference(forests, device):
    """The whole FS-B routing (forests grown block by block, search, Eq. 12 rescoring), at a query offset."""
    gen = torch.Generator().manual_seed(3)
    bsz, seq, heads, dim, s, blk = 1, 144, 2, 16, 4, 16  # the interpreter runs a program per query
    q = torch.randn(bsz, seq, heads, dim, generator=gen).to(device)
    spread = 0.5 + torch.rand(bsz, seq, heads, 1, generator=gen)  # a_c varies: the prior and tau matter
    k = (torch.randn(bsz, seq, heads, dim, generator=gen) * spread).to(device)
    tau = k.norm(dim=-1).median(dim=1).values[0]  # [H]: some cells above it, some below
    kw = dict(variant="fsb", cell_size=s, block_size=blk, top_k=3, beam_width=4, tau=tau, forests=forests)
    want = select_cells(q[:, 128:], k, *fs_pair(impl="reference", **kw), q_start=128)  # the last block's queries
    got = select_cells(q[:, 128:], k, *fs_pair(impl="triton", **kw), q_start=128)
    assert torch.equal(got, want)
    assert bool((want >= 0).any())


def test_host_work_does_not_grow_with_the_forests(device):
    """The reference dispatches tens of ops per tree level; the kernel's call is the same few ops
    (one launch on a GPU) whatever the forests' depth."""
    dispatched = {}
    for cells in (32, 512):
        forests = grown_forests(4, cells, 16, F32, seed=0, device=device)
        q, pos = torch.randn(4, 1, 16, device=device), torch.full((1,), cells * 16.0, device=device)
        ones = torch.ones(4, device=device)
        for impl in ("reference", "triton"):
            with torch.no_grad(), WorkCounter() as work:
                search(forests, q, pos, ones, ones, impl, beam_width=4)
            dispatched[impl, cells] = work.dispatched
    assert dispatched["triton", 32] == dispatched["triton", 512]
    assert dispatched["reference", 512] > dispatched["reference", 32] > dispatched["triton", 32]


def test_kernel_refuses_what_it_cannot_search():
    forests = grown_forests(2, 8, 8, F32, seed=0)
    q, pos, ones = torch.zeros(2, 1, 8), torch.zeros(1), torch.ones(2)
    with pytest.raises(ValueError, match="beam_width=65"):
        search(forests, q, pos, ones, ones, "triton", beam_width=65)
    with pytest.raises(ValueError, match="dtype torch.float16"):
        search(forests, q.half(), pos, ones, ones, "triton", beam_width=4)


def test_whole_sequence_routing_searches_a_window_of_blocks_in_one_launch(monkeypatch, device):
    """Every block's queries read their own state of the forests (`search_states`): one launch of the search
    per window of blocks (`fsframework.ops.fsb_states`), the reference's cells, also over several windows."""
    import fsframework.ops.fsb_search as search

    gen = torch.Generator().manual_seed(5)
    bsz, seq, heads, dim = 1, 48, 1, 16  # blocks of 16 at 16 and 32 search: the interpreter runs a program per query
    q, k = (torch.randn(bsz, seq, heads, dim, generator=gen).to(device) for _ in range(2))
    kw = dict(variant="fsb", cell_size=4, block_size=16, top_k=2, beam_width=3, forests="f0")
    want = select_cells(q, k, *fs_pair(impl="reference", **kw))
    assert bool((want[:, 16:] >= 0).all())
    windows = []
    build = search.forest_states

    def counting(*args, **kwargs):
        windows.append(args[-1].numel())
        return build(*args, **kwargs)

    monkeypatch.setattr(search, "forest_states", counting)
    for budget in (search.STATES_BUDGET_BYTES, 0):  # one window; the smallest windows the rule allows
        monkeypatch.setattr(search, "STATES_BUDGET_BYTES", budget)
        windows.clear()
        got = {}
        launches = kernel_launches(monkeypatch, lambda: got.update(cells=select_cells(q, k, *fs_pair(impl="triton",
                                                                                                        **kw))))
        assert torch.equal(got["cells"], want), budget
        assert launches == {("fsb_beam_kernel", None): len(windows)} and sum(windows) == 2, (launches, windows)
    assert len(windows) > 1
