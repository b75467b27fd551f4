"""Triton selected-cell readout vs fsframework.ops.freesolo.cell_readout (reference): forward and all gradients."""

import pytest
import torch

from fsframework.models.freesolo_settings import fs_config, fs_prior
from fsframework.ops.freesolo import cell_readout as reference
from fsframework.ops.freesolo import select_cells as reference_select
from fsf_kernels.cell_readout import DKDV, cell_readout, selections_by_cell
from kernel_testing import assert_close, gpu, needs_cuda

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

# (B, N, H, D, cell_size, top_k, gain, cells, dtype); gain: "hd" [H, D], "d" [D] or None;
# cells: "fs" = chosen by the reference router, "random" = random ids with -1 and duplicates
CPU_CASES = [
    (1, 63, 2, 32, 8, 4, "hd", "fs", F32),
    (1, 200, 2, 32, 8, 4, "d", "fs", F32),
    (2, 130, 1, 64, 32, 3, None, "fs", F32),
    (1, 200, 1, 128, 16, 4, "hd", "random", F32),
    (1, 520, 1, 32, 32, 4, "hd", "fs", F32),  # 33 query tiles, 16 cells, a ragged last tile
    (1, 200, 1, 48, 16, 2, "d", "random", F32),
    (1, 150, 2, 32, 16, 4, "hd", "fs", F16),
    (1, 150, 1, 64, 16, 4, "hd", "fs", BF16),
]
GPU_CASES = [
    (1, 8192, 4, 64, 32, 4, "hd", "fs", BF16),
    (2, 4099, 2, 128, 32, 4, "d", "random", BF16),
    (1, 4096, 2, 32, 16, 8, "hd", "fs", F16),
    (1, 2048, 2, 64, 32, 4, None, "random", F32),
    (1, 1024, 2, 256, 32, 8, "hd", "fs", BF16),  # the largest cell tile at d = 256
]


def _id(case):
    b, n, h, d, s, k, gain, cells, dt = case
    return f"B{b}-N{n}-H{h}-d{d}-s{s}-K{k}-g{gain}-{cells}-{str(dt).split('.')[-1]}"


def _cells(kind, q, k, cell_size, top_k, gen):
    bsz, seq, heads, _ = q.shape
    if kind == "fs":
        return reference_select(q.float(), k.float(),
                                fs_config("fs", cell_size=cell_size, block_size=2 * cell_size, top_k=top_k,
                                          impl="reference"), fs_prior())
    num = seq // cell_size
    cells = torch.randint(0, num, (bsz, seq, heads, top_k), generator=gen)
    cells[torch.rand(cells.shape, generator=gen) < 0.2] = -1
    cells[:, :5] = -1  # whole rows with nothing selected
    cells[:, 7, :, 1] = cells[:, 7, :, 0]  # a duplicated cell counts twice, as in the reference
    return cells.to(q.device)


def _check(case, device, dkdv="by_cell"):
    bsz, seq, heads, dim, s, top_k, gain, kind, dtype = case
    gen = torch.Generator().manual_seed(seq + dim)
    q, k, v = (torch.randn(bsz, seq, heads, dim, generator=gen).to(device, dtype).requires_grad_() for _ in range(3))
    cells = _cells(kind, q.detach(), k.detach(), s, top_k, gen)
    g = None
    if gain is not None:
        g = (1 + 0.3 * torch.randn((heads, dim) if gain == "hd" else (dim,), generator=gen)).to(device, dtype)
        g.requires_grad_()
    grad = torch.randn(bsz, seq, heads, dim, generator=gen).to(device, dtype)
    leaves = (q, k, v) + ((g,) if g is not None else ())
    out = cell_readout(q, k, v, cells, fs_config(cell_size=s), rms_weight=g, eps=1e-8, dkdv=dkdv)
    got = torch.autograd.grad(out, leaves, grad)
    ref_leaves = tuple(x.detach().float().requires_grad_() for x in leaves)
    ref_g = ref_leaves[3] if g is not None else None
    ref = reference(*ref_leaves[:3], cells, fs_config(cell_size=s, impl="reference"), rms_weight=ref_g, eps=1e-8)
    want = torch.autograd.grad(ref, ref_leaves, grad.float())
    assert out.dtype == dtype
    assert_close(out, ref, dtype, "out")
    for name, a, b in zip(("dq", "dk", "dv", "drms_weight"), got, want):
        assert_close(a, b, dtype, name)
    empty = (cells < 0).all(-1)
    assert (out[empty] == 0).all() and (got[0][empty] == 0).all()


@pytest.mark.parametrize("case", CPU_CASES, ids=_id)
def test_matches_reference(case, device):
    _check(case, device)


@pytest.mark.parametrize("case", [CPU_CASES[3], CPU_CASES[4]], ids=_id)
def test_atomic_dkdv_matches_reference(case, device):
    """The first backward design (each query tile adds its share of dk/dv atomically), kept as an
    option to time against the by-cell default."""
    _check(case, device, dkdv="atomic")


@gpu
@needs_cuda
@pytest.mark.parametrize("dkdv", DKDV)
@pytest.mark.parametrize("case", GPU_CASES, ids=_id)
def test_matches_reference_gpu(case, dkdv):
    _check(case, "cuda", dkdv)


def test_selections_by_cell_lists_every_selection_under_its_cell():
    gen = torch.Generator().manual_seed(3)
    bsz, seq, heads, top_k, num = 2, 37, 3, 4, 6
    cells = torch.randint(0, num, (bsz, seq, heads, top_k), generator=gen)
    cells[torch.rand(cells.shape, generator=gen) < 0.3] = -1
    cells[:, 5, :, 1] = cells[:, 5, :, 0]  # a duplicate is listed twice
    rows, starts = selections_by_cell(cells, num)
    assert starts[-1] == (cells >= 0).sum() and rows.dtype == torch.int32
    for b in range(bsz):
        for h in range(heads):
            for c in range(num):
                seg = (b * heads + h) * num + c
                got = rows[starts[seg]:starts[seg + 1]].tolist()
                want = [i for i in range(seq) for slot in range(top_k) if cells[b, i, h, slot] == c]
                assert got == want, (b, h, c)


def test_the_by_cell_backward_is_deterministic(device):
    """No atomics: the same inputs give bit-identical dk and dv on every run."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 256, 2, 32, generator=gen).to(device).requires_grad_() for _ in range(3))
    cells = reference_select(q.detach(), k.detach(),
                             fs_config(cell_size=16, block_size=32, top_k=4, impl="reference"), fs_prior())
    grad = torch.randn(1, 256, 2, 32, generator=gen).to(device)
    runs = [torch.autograd.grad(cell_readout(q, k, v, cells, fs_config(cell_size=16)), (k, v), grad) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@needs_cuda
@pytest.mark.parametrize("dkdv", DKDV)
def test_the_readout_never_waits_for_the_gpu(dkdv):
    """No device-to-host synchronization in the forward or the backward: a wait drains the queue the
    host keeps ahead of the GPU (a bincount in `selections_by_cell` once did it in every backward)."""
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 512, 2, 64, generator=gen).cuda().requires_grad_() for _ in range(3))
    cells = reference_select(q.detach(), k.detach(), fs_config(top_k=4, impl="reference"), fs_prior())
    grad = torch.randn(1, 512, 2, 64, generator=gen).cuda()
    torch.autograd.grad(cell_readout(q, k, v, cells, fs_config(), dkdv=dkdv), (q, k, v), grad)  # compiled outside
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        torch.autograd.grad(cell_readout(q, k, v, cells, fs_config(), dkdv=dkdv), (q, k, v), grad)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_an_unknown_dkdv_is_refused():
    x = torch.randn(1, 32, 2, 16)
    with pytest.raises(ValueError, match="dkdv"):
        cell_readout(x, x, x, torch.zeros(1, 32, 2, 4, dtype=torch.long), fs_config(cell_size=8), dkdv="sorted")


def test_nothing_selected_is_exactly_zero(device):
    q, k, v = (torch.randn(1, 40, 2, 32, device=device, requires_grad=True) for _ in range(3))
    g = torch.ones(2, 32, device=device, requires_grad=True)
    cells = torch.full((1, 40, 2, 4), -1, dtype=torch.long, device=device)
    out = cell_readout(q, k, v, cells, fs_config(cell_size=8), rms_weight=g)
    grads = torch.autograd.grad(out, (q, k, v, g), torch.randn_like(out))
    assert (out == 0).all()
    for x in grads:
        assert (x == 0).all()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(cells_shape=(1, 32, 2)), "cells"),
        (dict(rms_shape=(3, 16)), "rms_weight"),
        (dict(cell_size=0), "cell_size"),
    ],
    ids=["cells-3d", "gain-shape", "zero-cell-size"],
)
def test_bad_sizes(kwargs, match):
    x = torch.randn(1, 32, 2, 16)
    cells = torch.zeros(kwargs.get("cells_shape", (1, 32, 2, 4)), dtype=torch.long)
    g = torch.ones(kwargs["rms_shape"]) if "rms_shape" in kwargs else None
    with pytest.raises(ValueError, match=match):
        cell_readout(x, x, x, cells, fs_config(cell_size=kwargs.get("cell_size", 8)), rms_weight=g)


def test_reference_module_dispatches_here(device):
    """fsframework's impl="triton" path reaches this kernel by its pinned name."""
    q, k, v = (torch.randn(1, 64, 1, 16, device=device) for _ in range(3))
    cells = reference_select(q, k, fs_config(cell_size=8, block_size=16, top_k=2, impl="reference"), fs_prior())
    got = reference(q, k, v, cells, fs_config(cell_size=8, impl="triton"))
    assert_close(got, reference(q, k, v, cells, fs_config(cell_size=8, impl="reference")), torch.float32, "out")


@gpu  # also in the GPU check: on a device this runs the compiled kernels
def test_offset_call_equals_the_rows_of_the_whole_call(device):
    """With q_start the kernel reads out only the given queries over keys [0, q_start + n): the rows
    of the whole call, and the gradients the whole call gives when only those rows carry one."""
    gen = torch.Generator().manual_seed(7)
    bsz, seq, heads, dim, s = 1, 112, 2, 16, 8
    q, k, v = (torch.randn(bsz, seq, heads, dim, generator=gen).to(device).requires_grad_() for _ in range(3))
    g = (1 + 0.3 * torch.randn(heads, dim, generator=gen)).to(device).requires_grad_()
    cells = reference_select(q.detach(), k.detach(), fs_config(cell_size=s, block_size=16, top_k=3, impl="reference"),
                             fs_prior())
    grad = torch.randn(bsz, seq, heads, dim, generator=gen).to(device)
    for q_start, n in ((48, 64),):
        end = q_start + n
        whole = cell_readout(q[:, :end], k[:, :end], v[:, :end], cells[:, :end], fs_config(cell_size=s), rms_weight=g)
        row_grad = grad[:, :end].clone()
        row_grad[:, :q_start] = 0
        want = torch.autograd.grad(whole, (q, k, v, g), row_grad)
        got_out = cell_readout(q[:, q_start:end], k[:, :end], v[:, :end], cells[:, q_start:end],
                               fs_config(cell_size=s), rms_weight=g, q_start=q_start)
        assert got_out.shape == (bsz, n, heads, dim)
        assert torch.equal(got_out, whole[:, q_start:])
        got = torch.autograd.grad(got_out, (q, k, v, g), grad[:, q_start:end])
        for name, a, b in zip(("dq", "dk", "dv", "drms_weight"), got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"{name} at q_start={q_start}")
        # through the op's dispatcher, as the FreeSolo layer calls it
        via_op = reference(q[:, q_start:end], k[:, :end], v[:, :end], cells[:, q_start:end],
                           fs_config(cell_size=s, impl="triton"), rms_weight=g, q_start=q_start)
        assert torch.equal(via_op, got_out)


def test_where_the_by_cell_tiles_do_not_fit_the_backward_adds_atomically(monkeypatch, device):
    """On sm_86-class GPUs (101,376 B per block) the by-cell kernel's largest cell tile does not fit:
    there the backward forms dk/dv atomically (`support.readout_by_cell_tiles`), same gradients."""
    import importlib

    module = importlib.import_module("fsf_kernels.cell_readout.cell_readout")

    def by_cell(*args):
        raise AssertionError("the by-cell kernel ran where its tiles do not fit")

    monkeypatch.setattr(module, "device_target", lambda device: 86)
    monkeypatch.setattr(module, "selections_by_cell", by_cell)
    _check((1, 260, 1, 64, 128, 2, "hd", "random", F32), device)  # a 128 x 64 cell tile: 8,192 values
