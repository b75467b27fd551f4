"""`unique_cells` (one Triton launch) vs `unique_cells_reference` (two torch sorts): bit-identical lists.

For every (batch, head, tile of block_m queries) both give the sorted distinct cells its queries chose,
then `_NONE` padding, and their count; the readout's kernels walk these lists, so any difference,
however rare, would change which cells a query reads. The conftest fills fresh outputs with -12345, so a
slot the kernel leaves unwritten fails the comparison.
"""

import pytest
import torch

from fsf_kernels.cell_readout import unique_cells, unique_cells_reference
from kernel_testing import gpu, needs_cuda
from fsframework.models.freesolo_settings import fs_config

I32, I64 = torch.int32, torch.int64

# (B, N, H, K, block_m, ids, unused, dtype): ids are drawn from [0, ids) (few ids: many duplicates in
# a tile), a share `unused` of the slots is -1
CPU_CASES = [
    (1, 37, 2, 3, 16, 50, 0.2, I64),  # K = 3, a ragged last tile (37 = 2 * 16 + 5)
    (1, 64, 1, 4, 8, 20, 0.2, I64),  # whole tiles only
    (2, 50, 3, 4, 16, 4, 0.1, I64),  # B, H > 1, many duplicates within a tile
    (1, 45, 2, 8, 16, 30, 0.7, I64),  # mostly -1; UP = 128 is compared 32 slots at a time
    (2, 29, 2, 8, 8, 6, 0.3, I32),  # int32 ids, duplicates, ragged
    (1, 100, 2, 4, 16, 1000, 0.0, I32),  # no -1, few duplicates
    (1, 21, 1, 3, 8, 3, 0.5, I64),
    (1, 40, 1, 64, 16, 300, 0.3, I64),  # K = MAX_TOP_K: UP = 1024 in [1024, 8] tiles
]


def _id(case):
    b, n, h, k, bm, ids, unused, dt = case
    return f"B{b}-N{n}-H{h}-K{k}-bm{bm}-ids{ids}-unused{unused}-{str(dt).split('.')[-1]}"


def _cells(shape, ids, unused, dtype, gen):
    cells = torch.randint(0, ids, shape, generator=gen)
    cells[torch.rand(shape, generator=gen) < unused] = -1
    return cells.to(dtype)


def _assert_same(cells, block_m):
    got, want = unique_cells(cells, block_m), unique_cells_reference(cells, block_m)
    for name, a, b in zip(("ucells", "ucount"), got, want):
        assert a.dtype == b.dtype == torch.int32, (name, a.dtype, b.dtype)
        assert a.shape == b.shape, (name, a.shape, b.shape)
        assert torch.equal(a, b), f"{name} differs at {(a != b).nonzero()[:5].tolist()}"
    return got


@pytest.mark.parametrize("case", CPU_CASES, ids=_id)
def test_matches_reference(case, device):
    bsz, seq, heads, top_k, block_m, ids, unused, dtype = case
    gen = torch.Generator().manual_seed(seq * top_k + block_m)
    cells = _cells((bsz, seq, heads, top_k), ids, unused, dtype, gen)
    cells[:, :block_m] = -1  # a tile where nothing is selected: count 0, all padding
    cells[:, block_m + 1, :, 1:] = cells[:, block_m + 1, :, :1]  # a row that lists one cell K times
    _assert_same(cells.to(device), block_m)


@pytest.mark.parametrize("dtype", [I64, I32])
def test_nothing_selected(dtype, device):
    cells = torch.full((2, 35, 3, 4), -1, dtype=dtype, device=device)
    ucells, ucount = _assert_same(cells, 16)
    assert (ucount == 0).all() and (ucells == 2**31 - 1).all()


@pytest.mark.parametrize("view", ["permuted", "sliced-k", "sliced-n", "transposed-bh"])
@pytest.mark.parametrize("dtype", [I64, I32])
def test_non_contiguous_views(view, dtype, device):
    """The kernel reads cells through its strides: a view gives the same lists as its copy."""
    gen = torch.Generator().manual_seed(11)
    if view == "permuted":  # stored [B, H, N, K], seen as [B, N, H, K]
        cells = _cells((2, 3, 41, 4), 12, 0.3, dtype, gen).to(device).permute(0, 2, 1, 3)
    elif view == "sliced-k":  # every other of 8 slots
        cells = _cells((1, 41, 2, 8), 12, 0.3, dtype, gen).to(device)[..., ::2]
    elif view == "sliced-n":  # rows 5.. of a longer call, as with a query offset
        cells = _cells((2, 50, 2, 3), 12, 0.3, dtype, gen).to(device)[:, 5:]
    else:  # stored [N, K, H, B]
        cells = _cells((41, 4, 3, 2), 12, 0.3, dtype, gen).to(device).permute(3, 0, 2, 1)
    assert not cells.is_contiguous()
    for block_m in (8, 16):
        got = _assert_same(cells, block_m)
        assert all(torch.equal(a, b) for a, b in zip(got, unique_cells(cells.contiguous(), block_m)))


def test_ids_past_int32_sort_as_the_reference_does(device):
    """int64 ids >= 2^31 - 1 are never cells, but the contract is the reference's on every input:
    _NONE itself reads as unused, larger ids sort after the padding and are truncated to int32."""
    big = [5, 2**32 + 3, 2**31 - 1, 2**31, 5, -1, 2**40, 7, -2, 2**31, 0, 7]
    cells = torch.tensor(big, dtype=I64, device=device).view(1, 3, 1, 4)
    ucells, ucount = _assert_same(cells, 2)
    assert ucount.tolist() == [[[5, 3]]]


def test_the_readout_uses_the_kernel(monkeypatch, device):
    """cell_readout's lists come from the kernel; with the reference's lists the output is the same."""
    import importlib

    module = importlib.import_module("fsf_kernels.cell_readout.cell_readout")
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 70, 2, 16, generator=gen).to(device) for _ in range(3))
    cells = _cells((1, 70, 2, 4), 70 // 8, 0.3, I64, gen).to(device)
    got = module.cell_readout(q, k, v, cells, fs_config(cell_size=8))
    calls = []
    monkeypatch.setattr(module, "unique_cells", lambda c, bm: calls.append(1) or unique_cells_reference(c, bm))
    want = module.cell_readout(q, k, v, cells, fs_config(cell_size=8))
    assert calls and torch.equal(got, want)


@gpu
@needs_cuda
@pytest.mark.parametrize("top_k", [4, 8, 64])
@pytest.mark.parametrize("dtype", [I64, I32])
def test_matches_reference_gpu(top_k, dtype):
    gen = torch.Generator().manual_seed(top_k)
    cells = _cells((2, 8195, 4, top_k), 256, 0.2, dtype, gen).cuda()
    for block_m in (8, 16):
        _assert_same(cells, block_m)
        _assert_same(cells.transpose(1, 2).contiguous().transpose(1, 2), block_m)


@needs_cuda
def test_never_waits_for_the_gpu():
    cells = torch.randint(-1, 100, (1, 4096, 2, 4), device="cuda")
    unique_cells(cells, 16)  # compiled outside
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        unique_cells(cells, 16)
    finally:
        torch.cuda.set_sync_debug_mode("default")
