"""FS-B (docs/freesolo.md §1.8): forests, the U_v bound, beam search against a brute-force Eq. 12 top-K."""

from __future__ import annotations

import math

import pytest
import torch

from fsframework.models.freesolo_settings import fs_pair
from fsframework.ops.freesolo import select_cells
from fsframework.ops.freesolo_routing import top_k_earliest
from fsframework.ops.fsb_forest import (_chunk_offsets, _popcount, build_chunk_trees, build_trees, chunk_sizes,
                                        power_iteration)
from tests.forest import Forest

F64 = torch.float64
S, BLK = 4, 16  # small cells and blocks: many cells at a small N


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def qk(seq=160, heads=2, dim=8, bsz=2, seed=0):
    q, k = randn(bsz, seq, heads, dim, seed=seed), randn(bsz, seq, heads, dim, seed=seed + 1)
    # spread the key norms so that a_c varies from cell to cell and the prior matters
    return q, k * (0.5 + 2 * torch.rand(bsz, seq, heads, 1, generator=torch.Generator().manual_seed(seed + 2),
                                        dtype=F64))


def a_of(k):
    bsz, seq, heads, dim = k.shape
    return k[:, : seq // S * S].reshape(bsz, seq // S, S, heads, dim).norm(dim=-1).amax(2)  # Bt C H


def brute_eq12(q, k, *, K, admit=None, sigma=4.0, lam=1.0):
    """Top-K of Eq. 12 over the eligible (and admitted) cells, from full `[Bt, N, H, C]` scores."""
    bsz, seq, heads, dim = q.shape
    cells = seq // S
    kc = k[:, : cells * S].reshape(bsz, cells, S, heads, dim)
    logits = torch.einsum("bihd,bcshd->bihcs", q, kc) / math.sqrt(dim)
    i = torch.arange(seq, dtype=F64)[:, None]
    p = (torch.arange(cells, dtype=F64) + 0.5) * S
    a = a_of(k)  # Bt C H
    prior = lam * a.permute(0, 2, 1)[:, None] * torch.erf((i - p) / (2 * sigma))[None, :, None]
    scores = logits.logsumexp(-1) + prior
    eligible = (torch.arange(cells)[None] + 1) * S <= (torch.arange(seq)[:, None] // BLK * BLK)  # N C
    valid = eligible[None, :, None].expand(bsz, -1, heads, -1)
    if admit is not None:
        valid = valid & admit.permute(0, 2, 1)[:, None]
    return top_k_earliest(scores, valid, K)


def fsb(q, k, **kw):
    kw.setdefault("top_k", 3)
    q_start = kw.pop("q_start", 0)
    return select_cells(q, k, *fs_pair(variant="fsb", cell_size=S, block_size=BLK, **kw), q_start=q_start)


def test_chunks_follow_the_binary_expansion_and_height_is_log2():
    assert chunk_sizes(13) == [8, 4, 1]
    assert chunk_sizes(16) == [16] and chunk_sizes(0) == []
    for num in (1, 2, 3, 5, 8, 13, 21, 32, 37):
        kbar, a = randn(num, 3, seed=num), randn(num, seed=num).abs()
        forest = Forest(kbar, a, torch.arange(num, dtype=F64) + 0.5)
        forest.admit(torch.arange(num))
        assert [size for _, size, _ in forest.chunks] == chunk_sizes(num)
        assert forest.height() == math.ceil(math.log2(num))
        assert sorted(forest.leaves_below(forest.root)) == list(range(num))
        assert forest.size == 2 * num - 1


def test_chunk_offsets_count_the_larger_chunks_trees():
    """A row's chunk of 2^bit cells starts after the trees of its larger chunks (2 size - 1 nodes each),
    and the join nodes after every tree: the slots `Forests` writes, from one vectorised popcount."""
    counts = [0, 1, 2, 3, 13, 64, 100, 255, 4097, 2**40 + 2**33 + 5]
    offsets, trees_end = _chunk_offsets(torch.tensor(counts), 41)
    for row, count in enumerate(counts):
        sizes = chunk_sizes(count)
        assert int(trees_end[row]) == sum(2 * size - 1 for size in sizes)
        for i, size in enumerate(sizes):
            assert int(offsets[row, size.bit_length() - 1]) == sum(2 * big - 1 for big in sizes[:i])
    values = torch.tensor([0, 1, 6, 2**31 - 1, 2**62 + 3, 2**63 - 1])
    assert _popcount(values).tolist() == [bin(int(v)).count("1") for v in values]


def test_incremental_forest_equals_rebuilt():
    num = 45
    kbar, a = randn(num, 5, seed=3), randn(num, seed=4).abs()
    p = torch.arange(num, dtype=F64) + 0.5
    grown = Forest(kbar, a, p, capacity=1)
    for lo in range(0, num, 4):  # 4 cells per block boundary
        hi = min(lo + 4, num)
        grown.admit(torch.arange(lo, hi))
        fresh = Forest(kbar, a, p)
        fresh.admit(torch.arange(hi))
        for name, value in fresh.state().items():
            assert torch.equal(grown.state()[name], value), (hi, name)
        assert grown.root == fresh.root


def test_chunk_tree_nodes_store_exact_summaries_and_median_splits():
    num, dim = 16, 4
    kbar, a, p = randn(1, num, dim, seed=5), randn(1, num, seed=6).abs(), torch.arange(num, dtype=F64)[None] * 4 + 2
    tree = build_chunk_trees(kbar, a, p, torch.arange(num)[None])
    for g in range(2 * num - 1):
        depth = int(math.log2(g + 1))
        under = [c for c in range(num) if _ancestor(num - 1 + tree["cell"][0].tolist()[num - 1:].index(c), g)]
        assert len(under) == num >> depth  # perfect tree: median split, equal halves
        mu = kbar[0, under].mean(0)
        assert torch.allclose(tree["mu"][0, g], mu)
        assert torch.isclose(tree["rho"][0, g], (kbar[0, under] - mu).norm(dim=-1).max())
        assert tree["amax"][0, g] == a[0, under].max() and tree["pmin"][0, g] == p[0, under].min()


def test_trees_of_several_sizes_built_together_equal_each_size_alone():
    """`build_trees` splits the segments of one width together, whatever tree they belong to: the
    same nodes, number for number, as building each size on its own (and no size at all is none)."""
    groups = []
    for seed, (chunks, num) in enumerate([(3, 16), (2, 4), (1, 1), (2, 16), (4, 2)]):
        kbar = randn(chunks, num, 5, seed=10 + seed)
        kbar[0, : num // 2] = kbar[0, :1]  # repeated keys: ties on the median and zero directions
        groups.append((kbar, randn(chunks, num, seed=20 + seed).abs(), randn(chunks, num, seed=30 + seed),
                       torch.arange(chunks * num).view(chunks, num) + 100 * seed))
    together = build_trees(groups)
    for group, tree in zip(groups, together):
        alone = build_chunk_trees(*group)
        assert tree.keys() == alone.keys()
        for name in alone:
            assert torch.equal(tree[name], alone[name]), name
    assert build_trees([]) == []
    with pytest.raises(ValueError, match="power of two"):
        build_trees([(randn(1, 6, 2), randn(1, 6), randn(1, 6), torch.arange(6)[None])])


@pytest.mark.parametrize("arrivals", [[13], [4, 4, 4, 1], [1, 2, 3, 9, 1], [7, 16, 8]])
def test_join_chain_nodes_hold_their_cells_means_and_the_triangle_bound(arrivals):
    """The join chain, every chain at once along the bits: each join's mean is its cells' mean, A and
    pmin their max and min, its radius the recursive triangle bound over its chunk and the join
    below (and so at least every cell's distance), and its children that chunk and that join."""
    num, dim = sum(arrivals), 5
    kbar, a = randn(num, dim, seed=3), randn(num, seed=4).abs()
    p = (torch.arange(num, dtype=F64) + 0.5) * S
    forest, seen = Forest(kbar, a, p), 0
    for n in arrivals:  # admissions of several sizes: chunks merge on the way
        forest.admit(torch.arange(seen, seen + n))
        seen += n
    node, sizes = int(forest.root), chunk_sizes(num)
    chain = []  # the joins from the root down, each over a chunk (left) and the chain below (right)
    for size in sizes[:-1]:  # oldest (largest) chunk at the root
        assert len(forest.leaves_below(int(forest.left[node]))) == size
        chain.append(node)
        node = int(forest.right[node])
    assert len(forest.leaves_below(node)) == sizes[-1]  # the smallest chunk's tree ends the chain
    for join in chain:
        cells = forest.leaves_below(join)
        chunk, under = int(forest.left[join]), int(forest.right[join])
        assert torch.allclose(forest.mu[join], kbar[cells].mean(0), rtol=1e-12, atol=1e-12)
        assert forest.amax[join] == a[cells].max() and forest.pmin[join] == p[cells].min()
        bound = max(float((forest.mu[chunk] - forest.mu[join]).norm() + forest.rho[chunk]),
                    float((forest.mu[under] - forest.mu[join]).norm() + forest.rho[under]))
        assert math.isclose(float(forest.rho[join]), bound, rel_tol=1e-12)
        assert float(forest.rho[join]) >= float((kbar[cells] - forest.mu[join]).norm(dim=-1).max()) - 1e-12


def _ancestor(node: int, anc: int) -> bool:
    while node > anc:
        node = (node - 1) // 2
    return node == anc


def test_zero_power_iteration_gap_keeps_the_previous_direction():
    x = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]], dtype=F64)
    u = torch.tensor([0.0, 0.0, 3.0], dtype=F64)  # X u = 0: ||X^T X u|| = 0
    assert torch.equal(power_iteration(x, u), u)
    # identical mean keys: every centered key is 0, no NaN, the split keeps arrival order
    tree = build_chunk_trees(torch.ones(1, 8, 3, dtype=F64), torch.ones(1, 8, dtype=F64),
                             torch.arange(8, dtype=F64)[None], torch.arange(8)[None])
    assert tree["cell"][0, 7:].tolist() == list(range(8))
    assert torch.isfinite(tree["mu"]).all() and (tree["rho"] == 0).all()


@pytest.mark.parametrize("c", [1.0, 8.0])
def test_bound_is_above_every_cell_score_below_the_node(c):
    from fsframework.ops.fsb_search import node_bounds

    gen = torch.Generator().manual_seed(7)
    for trial in range(6):
        num, dim = int(torch.randint(2, 40, (1,), generator=gen)), 6
        kbar, a = randn(num, dim, seed=10 + trial), randn(num, seed=20 + trial).abs() * 3
        p = (torch.arange(num, dtype=F64) + 0.5) * S
        forest = Forest(kbar, a, p)
        forest.admit(torch.arange(num))
        q = randn(5, dim, seed=30 + trial) * 2
        pos = torch.full((5,), float(num * S + 3), dtype=F64)
        sigma, lam = torch.tensor(4.0, dtype=F64), torch.tensor(1.5, dtype=F64)
        nodes = torch.arange(forest.size).expand(1, 5, -1)
        bound = node_bounds(forest.store, q[None], pos, nodes, lam=lam[None], sigma=sigma[None], bound_c=c)[0]
        r = q @ kbar.T / math.sqrt(dim) + lam * a * torch.erf((pos[:, None] - p) / (2 * sigma))  # Eq. 7
        for v in range(forest.size):
            below = forest.leaves_below(v)
            assert (bound[:, v] >= r[:, below].amax(-1) - 1e-12).all()


@pytest.mark.parametrize("tau_kind", ["zero", "huge", "median"])
def test_wide_beam_is_exact_eq12_top_k(tau_kind):
    q, k = qk()
    a = a_of(k)
    tau = {"zero": torch.zeros(2, dtype=F64), "huge": torch.full((2,), 1e9, dtype=F64),
           "median": a.flatten(0, 1).median(0).values}[tau_kind]
    cells = q.shape[1] // S
    got = fsb(q, k, tau=tau, beam_width=cells)
    assert torch.equal(got, brute_eq12(q, k, K=3))
    assert got.shape == (2, 160, 2, 3) and (got[:, :BLK] == -1).all()


def test_ftau_alone_is_exact_over_cells_above_tau():
    q, k = qk(seed=5)
    a = a_of(k)
    tau = a.flatten(0, 1).median(0).values
    got = fsb(q, k, tau=tau, beam_width=q.shape[1] // S, forests="ftau")
    assert torch.equal(got, brute_eq12(q, k, K=3, admit=a >= tau))
    f0 = fsb(q, k, beam_width=q.shape[1] // S, forests="f0")
    assert torch.equal(f0, brute_eq12(q, k, K=3))


def test_narrow_beam_selects_admitted_cells_in_score_order():
    q, k = qk(seq=320, seed=9)
    got = fsb(q, k, tau=torch.zeros(2, dtype=F64), beam_width=4)
    exact = brute_eq12(q, k, K=3)
    eligible = (torch.arange(320) // BLK * BLK // S)[None, :, None, None]
    assert ((got == -1) | (got < eligible)).all()
    assert (got >= 0).sum() == (exact >= 0).sum()  # Wb >= K: the beam always finds K cells
    assert (got[..., 0] == exact[..., 0]).float().mean() > 0.5  # a useful search, not an exact one


def test_query_offset_rows_equal_whole_call_rows():
    q, k = qk(seq=128, seed=11)
    tau = a_of(k).flatten(0, 1).median(0).values
    whole = fsb(q, k, tau=tau, beam_width=4)
    for start in (32, 96):
        part = fsb(q[:, start:], k, tau=tau, beam_width=4, q_start=start)
        assert torch.equal(part, whole[:, start:])
        short = fsb(q[:, start:start + 16], k[:, :start + 16], tau=tau, beam_width=4, q_start=start)
        assert torch.equal(short, whole[:, start:start + 16])


def test_float32_inputs_run_in_float32():
    q, k = qk(seq=96)
    tau = torch.zeros(2)
    got = fsb(q.float(), k.float(), tau=tau, beam_width=24)
    assert torch.equal(got, brute_eq12(q, k, K=3)) or (got != brute_eq12(q, k, K=3)).float().mean() < 0.01


@pytest.mark.parametrize("kw, match", [
    (dict(tau=torch.zeros(3)), r"tau must be a tensor of shape \(2,\)"),
    (dict(tau=torch.tensor([0.0, float("nan")])), "tau must be finite"),
    (dict(tau=torch.tensor([0.0, float("inf")])), "tau must be finite"),
    (dict(tau=None), "fsf calibrate"),
    (dict(tau=torch.zeros(2), beam_width=2), r"beam_width=2 must be >= top_k=3"),
    (dict(tau=torch.zeros(2), forests="both_and_more"), "forests must be one of"),
    (dict(tau=torch.zeros(2), bound_c=-1.0), "bound_c"),
])
def test_bad_input_errors(kw, match):
    q, k = qk(seq=48, bsz=1)
    with pytest.raises(ValueError, match=match):
        fsb(q, k, **kw)


def test_rows_and_heads_searched_together_equal_each_alone():
    q, k = qk(seq=192, seed=13)
    tau = a_of(k).flatten(0, 1).median(0).values
    together = fsb(q, k, tau=tau, beam_width=4, lam=torch.tensor([1.0, 0.5], dtype=F64))
    for b in range(2):
        for h in range(2):
            alone = fsb(q[b:b + 1, :, h:h + 1], k[b:b + 1, :, h:h + 1], tau=tau[h:h + 1], beam_width=4,
                        lam=[1.0, 0.5][h])
            assert torch.equal(together[b:b + 1, :, h:h + 1], alone)


def test_rows_grown_together_equal_each_grown_alone():
    """`Forests` grows rows that admit different cells (as F0 and Ftau do) in one batched step per
    chunk size; every row's nodes equal those of a forest grown alone."""
    from fsframework.ops.fsb_forest import Forests

    num, dim, rows = 37, 5, 3
    kbar, a = randn(rows, num, dim, seed=11), randn(rows, num, seed=12).abs()
    p = torch.arange(num, dtype=F64) + 0.5
    thresholds = torch.tensor([float("-inf"), 0.5, 1.0], dtype=F64)  # every cell, about half, fewer
    together = Forests(rows, dim, dtype=F64, device=torch.device("cpu"), capacity=1)
    alone = [Forest(kbar[r], a[r], p, capacity=1) for r in range(rows)]
    for lo in range(0, num, 5):
        ids = torch.arange(lo, min(lo + 5, num))
        keep = a[:, ids] >= thresholds[:, None]
        together.admit(kbar[:, ids], a[:, ids], p[ids], ids, keep)
        for r, forest in enumerate(alone):
            forest.admit(ids[keep[r]])
            size = forest.size
            assert int(together.root[r]) == forest.root and int(together.count[r]) == forest.num_cells
            for name, value in forest.state().items():
                assert torch.equal(together.store.tensors[name][r, :size], value), (lo, r, name)
