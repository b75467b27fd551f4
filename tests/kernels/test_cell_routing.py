"""Triton FS / FS-L cell selection vs fsframework.ops.freesolo.select_cells (reference)."""

import pytest
import torch

from fsframework.models.freesolo_settings import fs_config, fs_pair, fs_prior
from fsframework.ops.freesolo import select_cells as reference
from fsf_kernels.cell_routing import select_cells
from kernel_testing import gpu, needs_cuda, routing_scores

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

# (variant, B, N, H, D, cell_size, block_size, top_k, retained P, recent W, dtype)
CPU_CASES = [
    ("fs", 1, 63, 2, 32, 8, 16, 4, 64, 8, F32),
    ("fs", 1, 200, 2, 32, 8, 32, 4, 64, 8, F32),
    ("fs", 2, 1000, 1, 64, 16, 64, 3, 64, 8, F32),
    ("fsl", 1, 300, 2, 32, 8, 32, 4, 5, 3, F32),
    ("fsl", 1, 1000, 1, 32, 32, 128, 4, 64, 8, F32),
    ("fsl", 1, 1000, 1, 128, 8, 24, 4, 6, 2, F32),
    ("fsl", 1, 130, 1, 32, 4, 12, 5, 0, 3, F32),
    ("fsl", 1, 130, 1, 32, 4, 12, 5, 7, 0, F32),
    # several 64-cell tiles per query: far tiles take the kernel's erf-free prior, near ones do not
    ("fs", 1, 400, 2, 16, 2, 16, 4, 64, 8, F32),
    ("fsl", 1, 400, 2, 16, 2, 16, 4, 70, 4, F32),
    ("fs", 1, 200, 1, 48, 8, 32, 4, 64, 8, BF16),
    ("fsl", 1, 200, 1, 32, 8, 32, 4, 4, 2, F16),
]
GPU_CASES = [
    ("fs", 1, 8192, 4, 64, 32, 128, 4, 64, 8, BF16),
    ("fsl", 1, 16384, 4, 64, 32, 128, 4, 64, 8, BF16),
    ("fsl", 2, 4099, 2, 128, 32, 128, 4, 64, 8, F32),
    ("fsl", 1, 8192, 2, 256, 16, 128, 64, 1024, 8, BF16),  # the largest K and P, at d = 256
]


def _id(case):
    var, b, n, h, d, s, blk, k, p, w, dt = case
    return f"{var}-B{b}-N{n}-H{h}-d{d}-s{s}-blk{blk}-K{k}-P{p}-W{w}-{str(dt).split('.')[-1]}"


def _inputs(case, device, gen):
    var, bsz, seq, heads, dim, s, blk, top_k, p, w, dtype = case
    q = torch.randn(bsz, seq, heads, dim, generator=gen).to(device, dtype)
    k = torch.randn(bsz, seq, heads, dim, generator=gen).to(device, dtype)
    kwargs = dict(variant=var, cell_size=s, block_size=blk, top_k=top_k, retained_cells=p, recent_cells=w,
                  sigma=(torch.rand(heads, generator=gen) * 6 + 0.5).to(device), lam=0.8)
    return q, k, kwargs


def _assert_same_selection(got, want, q, k, kwargs, atol):
    """Identical index sets, except where the fp64 scores of the differing picks tie within atol."""
    assert got.dtype == torch.long and got.shape == want.shape
    assert ((got >= 0).sum(-1) == (want >= 0).sum(-1)).all(), "different numbers of selected cells"
    bad = (got != want).any(-1)
    if not bad.any():
        return
    sk = dict(cell_size=kwargs["cell_size"], block_size=kwargs["block_size"], sigma=kwargs["sigma"].cpu(),
              lam=kwargs["lam"])
    s_got = routing_scores(q.cpu(), k.cpu(), got.cpu(), **sk)
    s_want = routing_scores(q.cpu(), k.cpu(), want.cpu(), **sk)
    gap = (s_got - s_want).abs().nan_to_num(0.0).amax(-1)[bad.cpu()]
    assert gap.max() <= atol, f"{int(bad.sum())} rows differ, worst score gap {gap.max():.3e}"


def _check(case, device, atol):
    gen = torch.Generator().manual_seed(case[2] + case[4])
    q, k, kwargs = _inputs(case, device, gen)
    got = select_cells(q, k, *fs_pair(**kwargs))
    want = reference(q.float(), k.float(), *fs_pair(**kwargs, impl="reference"))
    _assert_same_selection(got, want, q.float(), k.float(), kwargs, atol)


@pytest.mark.parametrize("case", CPU_CASES, ids=_id)
def test_matches_reference(case, device):
    _check(case, device, atol=1e-5)


@gpu
@needs_cuda
@pytest.mark.parametrize("case", GPU_CASES, ids=_id)
def test_matches_reference_gpu(case):
    # half inputs score with tf32 products on the GPU
    _check(case, "cuda", atol=1e-5 if case[-1] == F32 else 2e-2)


@pytest.mark.parametrize("variant", ["fs", "fsl"])
def test_ties_go_to_the_earlier_cell(variant, device):
    """Repeated cells have identical summaries and scores; the earlier copy must be chosen first.
    Small integers make every mean and dot product exact in fp32, so the scores tie exactly
    whatever order a kernel sums in (with random floats, cells summed in another tile can
    differ in the last bit, and which cell "wins" is then rounding, not tie-breaking)."""
    gen = torch.Generator().manual_seed(0)
    cell = torch.randint(-3, 4, (1, 8, 1, 32), generator=gen).float()
    k = cell.repeat(1, 24, 1, 1).to(device)  # 24 identical cells of 8 tokens
    q = torch.randint(-3, 4, (1, 192, 1, 32), generator=gen).float().to(device)
    kwargs = dict(variant=variant, cell_size=8, block_size=32, top_k=3, retained_cells=4, recent_cells=1,
                  sigma=4.0, lam=0.0)
    got = select_cells(q, k, *fs_pair(**kwargs))
    want = reference(q, k, *fs_pair(**kwargs, impl="reference"))
    assert torch.equal(got, want)


def test_fsl_equals_fs_when_everything_is_retained(device):
    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 300, 2, 32, generator=gen).to(device) for _ in range(2))
    common = dict(cell_size=8, block_size=32, top_k=4, recent_cells=3)
    fs = select_cells(q, k, *fs_pair(variant="fs", retained_cells=64, **common))
    fsl = select_cells(q, k, *fs_pair(variant="fsl", retained_cells=300 // 8, **common))
    assert torch.equal(fs, fsl)


def test_first_block_and_short_sequences_select_nothing(device):
    q = torch.randn(1, 100, 1, 16, device=device)
    got = select_cells(q, q, fs_config("fs", cell_size=32, block_size=128, top_k=4), fs_prior())
    assert (got == -1).all()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(block_size=40, cell_size=32), "multiple"),
        (dict(variant="dense"), "variant"),
        (dict(top_k=0), "top_k"),
        (dict(sigma=torch.ones(3)), "sigma"),
    ],
    ids=["block-not-multiple", "bad-variant", "zero-top-k", "sigma-shape"],
)
def test_bad_sizes(kwargs, match, device):
    x = torch.randn(1, 64, 2, 16, device=device)
    kwargs = {name: value.to(device) if torch.is_tensor(value) else value for name, value in kwargs.items()}
    with pytest.raises(ValueError, match=match):
        select_cells(x, x, *fs_pair(**kwargs))


def test_reference_module_dispatches_here(device):
    """fsframework's impl="triton" path reaches this kernel by its pinned name."""
    q, k = (torch.randn(1, 100, 1, 16, device=device) for _ in range(2))
    kwargs = dict(variant="fsl", cell_size=8, block_size=16, top_k=2, retained_cells=3, recent_cells=1)
    assert torch.equal(reference(q, k, *fs_pair(**kwargs, impl="triton")),
                       reference(q, k, *fs_pair(**kwargs, impl="reference")))


@gpu  # also in the GPU check: on a device this runs the compiled kernels
@pytest.mark.parametrize("variant", ["fs", "fsl"])
def test_offset_call_equals_the_rows_of_the_whole_call(variant, device):
    """With q_start the kernel scores only the given queries (their blocks): the same cells as rows
    [q_start, q_start + n) of the call on the whole sequence, a partial last block included."""
    gen = torch.Generator().manual_seed(5)
    q, k = (torch.randn(1, 200, 1, 16, generator=gen).to(device) for _ in range(2))
    kwargs = dict(variant=variant, cell_size=8, block_size=32, top_k=3, retained_cells=4, recent_cells=2, lam=0.8)
    whole = select_cells(q, k, *fs_pair(**kwargs))
    for q_start, n in ((96, 104), (64, 32)):  # to the partial last block, and one block inside
        got = select_cells(q[:, q_start:q_start + n], k[:, :q_start + n], *fs_pair(**kwargs), q_start=q_start)
        assert got.shape == (1, n, 1, 3)
        assert torch.equal(got, whole[:, q_start:q_start + n]), (q_start, n)
    # the op's offset form reaches the kernel with the offset (no padding of the earlier queries)
    got = reference(q[:, 160:], k, *fs_pair(impl="triton", **kwargs), q_start=160)
    assert torch.equal(got, whole[:, 160:])


def test_fsl_at_the_largest_p_retains_every_cell(device):
    """P = 1024 (the largest the kernel takes, 16 chunks of the retained list per tile): with fewer
    cells than P, FS-L retains them all and selects what FS selects."""
    gen = torch.Generator().manual_seed(3)
    q, k = (torch.randn(1, 96, 1, 16, generator=gen).to(device) for _ in range(2))
    common = dict(cell_size=4, block_size=32, top_k=3, recent_cells=1)
    fs = select_cells(q, k, *fs_pair(variant="fs", **common))
    assert torch.equal(select_cells(q, k, *fs_pair(variant="fsl", retained_cells=1024, **common)), fs)


@pytest.mark.parametrize("variant", ["fs", "fsl"])
def test_the_small_shared_memory_tiles(monkeypatch, variant, device):
    """GPUs with 101,376 B per block (sm_86 class) score 16 cells per step at d = 256
    (`fsf_kernels.common.support.routing_cell_tile`): 25 cells take two steps; same selection."""
    import importlib

    module = importlib.import_module("fsf_kernels.cell_routing.cell_routing")
    monkeypatch.setattr(module, "device_target", lambda device: 86)
    _check((variant, 1, 200, 1, 256, 8, 16, 4, 20, 2, F32), device, atol=1e-5)


@gpu
@pytest.mark.parametrize("variant", ["fs", "fsl"])
def test_routing_from_gathered_summaries_equals_routing_from_the_keys(variant, device):
    """A sequence-parallel rank routes from summaries gathered slice by slice: the kernel's summaries of
    each slice, concatenated, route the rank's queries to exactly the cells of the call on the keys,
    through the kernel and through the op (impl="triton")."""
    from fsf_kernels.cell_routing import cell_summaries, select_cells_from_summaries
    from fsframework.ops.freesolo import select_cells_from_summaries as op_from_summaries
    from fsframework.ops.freesolo import summarize_cells

    gen = torch.Generator().manual_seed(9)
    q, k = (torch.randn(2, 200, 2, 16, generator=gen).to(device) for _ in range(2))
    kwargs = dict(variant=variant, cell_size=8, block_size=32, top_k=3, retained_cells=4, recent_cells=2,
                  sigma=torch.tensor([2.0, 5.0]).to(device), lam=0.8)
    whole = select_cells(q, k, *fs_pair(**kwargs))
    slices = [(0, 64), (64, 160), (160, 200)]
    pieces = [cell_summaries(k[:, lo:hi], 8) for lo, hi in slices]
    kbar, a = (torch.cat([p[i] for p in pieces], dim=2) for i in range(2))
    for lo, hi in slices[1:]:
        got = select_cells_from_summaries(q[:, lo:hi], kbar[:, :, :hi // 8], a[:, :, :hi // 8], *fs_pair(**kwargs),
                                          q_start=lo)
        assert torch.equal(got, whole[:, lo:hi]), (lo, hi)
        config, prior = fs_pair(impl="triton", **kwargs)
        via_op = op_from_summaries(q[:, lo:hi], *summarize_cells(k[:, :hi], config), config, prior, q_start=lo)
        assert torch.equal(via_op, whole[:, lo:hi]), (lo, hi)
    with pytest.raises(ValueError, match="summaries of the 25 complete cells"):
        select_cells_from_summaries(q[:, 160:], kbar[:, :, :20], a[:, :, :20], *fs_pair(**kwargs), q_start=160)

