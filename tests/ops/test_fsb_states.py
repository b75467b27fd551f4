"""FS-B's forests of every block built at once (fsframework.ops.fsb_states) against the forests a
decode cache grows piece by piece (`Forests.admit`): the same nodes, reached from each state's root."""

from __future__ import annotations

import pytest
import torch

import fsframework.ops.fsb_states as states
from fsframework.models.freesolo_settings import fs_config, fs_pair, fs_prior
from fsframework.ops.freesolo import select_cells
from fsframework.ops.fsb_forest import Forests, NodeStore
from fsframework.ops.fsb_states import forest_states

FIELDS = ("mu", "rho", "amax", "pmin", "cell")


def walk(store: NodeStore, row: int, node: int) -> list:
    """The tree below `node` in depth-first order (left first): each node's fields, no slot numbers."""
    if node < 0:
        return []
    t = store.tensors
    here = [tuple(t[name][row, node].tolist()) if name == "mu" else t[name][row, node].item() for name in FIELDS]
    return [here] + walk(store, row, int(t["left"][row, node])) + walk(store, row, int(t["right"][row, node]))


def test_every_state_equals_the_forests_grown_piece_by_piece():
    gen = torch.Generator().manual_seed(0)
    rows, cells, dim = 4, 70, 6
    kbar = torch.randn(rows, cells, dim, generator=gen, dtype=torch.float64)
    a = torch.rand(rows, cells, generator=gen, dtype=torch.float64)
    p = (torch.arange(cells, dtype=torch.float64) + 0.5) * 4
    keep = torch.rand(rows, cells, generator=gen) < torch.tensor([1.0, 0.6, 0.2, 0.0])[:, None]  # row 3: none
    arrived = torch.tensor([0, 4, 4, 9, 16, 33, 47, 64, 70])  # uneven pieces, one empty, one of nothing yet
    store, roots = forest_states(kbar, a, p, torch.arange(cells), keep, arrived)
    assert roots.shape == (rows, len(arrived))
    grown = Forests(rows, dim, dtype=torch.float64, device="cpu")
    seen = 0
    for state, upto in enumerate(arrived.tolist()):
        grown.admit(kbar[:, seen:upto], a[:, seen:upto], p[seen:upto], torch.arange(seen, upto), keep[:, seen:upto])
        seen = upto
        for row in range(rows):
            assert walk(store, row, int(roots[row, state])) == walk(grown.store, row, int(grown.root[row])), \
                (state, row)
    assert (roots[3] == -1).all() and (roots[:, 0] == -1).all()


def test_whole_sequence_routing_builds_each_chunk_size_once(monkeypatch):
    """Trees are built in one batched call for every chunk size, not block by block: one call per
    window of blocks (here one window), each size at most once, `log2 M + 1` sizes for M cells."""
    calls, build = [], states.build_trees

    def counting(groups):
        calls.append([kbar.shape[1] for kbar, *_ in groups])
        return build(groups)

    monkeypatch.setattr(states, "build_trees", counting)
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1024, 2, 8, generator=gen), torch.randn(1, 1024, 2, 8, generator=gen)
    select_cells(q, k, fs_config("fsb", cell_size=4, block_size=16, top_k=2, beam_width=4),
                 fs_prior(tau=torch.zeros(2)))  # 63 blocks, 252 cells
    assert len(calls) == 1, calls
    assert len(calls[0]) == len(set(calls[0])) <= (252).bit_length(), calls


def test_windows_of_blocks_select_the_same_cells(monkeypatch):
    """Under a memory budget the blocks' forests are built a window at a time (each window only the
    chunk trees its blocks use): the same cells, also from a query offset inside a window."""
    import fsframework.ops.fsb_search as search

    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 1024, 2, 8, generator=gen), torch.randn(2, 1024, 2, 8, generator=gen)
    kw = dict(variant="fsb", cell_size=4, block_size=16, top_k=2, beam_width=4, tau=torch.full((2,), 2.8))
    whole = select_cells(q, k, *fs_pair(**kw))
    built, build = [], states.forest_states

    def counting(*args, **kwargs):
        built.append(args[-1].numel())
        return build(*args, **kwargs)

    monkeypatch.setattr(search, "forest_states", counting)
    monkeypatch.setattr(search, "STATES_BUDGET_BYTES", 0)  # the smallest windows the rule allows
    assert torch.equal(select_cells(q, k, *fs_pair(**kw)), whole)
    assert len(built) > 3 and sum(built) == 1024 // 16 - 1  # every block's forests, in several windows
    built.clear()
    assert torch.equal(select_cells(q[:, 528:], k, *fs_pair(**kw), q_start=528), whole[:, 528:])
    assert sum(built) < 1024 // 16 - 1  # windows before the first query's block are not built
    built.clear()
    assert select_cells(q[:, :0], k, *fs_pair(**kw), q_start=1024).shape == (2, 0, 2, 2) and not built  # no query


@pytest.mark.parametrize("keys_budget", [None, 1])  # every block in one step; a block a step
def test_blocks_rescored_together_equal_each_block_alone(keys_budget):
    """`rescore_blocks` keeps each block's own union of candidates: the cells `rescore` selects block by
    block, with unions of different widths padded together, duplicates, pads and an empty block."""
    from fsframework.ops.fsb_search import rescore, rescore_blocks

    gen = torch.Generator().manual_seed(4)
    groups, blocks, num_q, dim, s, cells = 3, 5, 6, 4, 4, 40
    q = torch.randn(groups, blocks, num_q, dim, generator=gen)
    keys, a = torch.randn(groups, cells, s, dim, generator=gen), torch.rand(groups, cells, generator=gen) * 2
    pos = (torch.arange(blocks * num_q, dtype=torch.float32) + 160).view(blocks, num_q)
    cand = torch.randint(-1, cells, (groups, blocks, num_q, 7), generator=gen)
    cand[:, 1] = cand[:, 1] % 3  # a narrow union
    cand[:, 2] = -1  # a block with no candidate
    config, prior = fs_config(cell_size=s, top_k=3), fs_prior(lam=torch.rand(groups, generator=gen),
                                                              sigma=torch.rand(groups, generator=gen) * 20 + 1)
    got = rescore_blocks(q, keys, a, pos, cand, config, prior, keys_budget=keys_budget)
    want = torch.stack([rescore(q[:, j], keys, a, pos[j], cand[:, j], config, prior) for j in range(blocks)], dim=1)
    assert torch.equal(got, want) and bool((got[:, 2] == -1).all()) and bool((got[:, 0] >= 0).any())


def test_whole_sequence_routing_rescores_its_blocks_in_few_steps(monkeypatch):
    """Whole-sequence FS-B rescores the blocks of a window together (`rescore_blocks`), in steps bounded by
    the gathered keys and the blocks' eligible cells and groups bounded by the candidates, not a step per
    block."""
    import fsframework.ops.fsb_search as search

    steps = []
    step = search._rescore_step
    monkeypatch.setattr(search, "_rescore_step", lambda *args: steps.append(args[0].shape[1]) or step(*args))
    gen = torch.Generator().manual_seed(6)
    q, k = torch.randn(1, 512, 2, 8, generator=gen), torch.randn(1, 512, 2, 8, generator=gen)
    kw = dict(variant="fsb", cell_size=4, block_size=16, top_k=2, beam_width=4, tau=torch.full((2,), 2.8))
    whole = select_cells(q, k, *fs_pair(**kw))
    # every block after the first; the early ones apart (a step never pads a block's union past the cells
    # it could name), the rest together
    assert sum(steps) == 512 // 16 - 1 and len(steps) <= 6 and max(steps) >= 16, steps
    # the blocks taken in groups whose candidates fit CANDIDATES_BUDGET: here a block a group
    steps.clear()
    monkeypatch.setattr(search, "CANDIDATES_BUDGET", 1)
    assert torch.equal(select_cells(q, k, *fs_pair(**kw)), whole) and steps == [1] * (512 // 16 - 1)
