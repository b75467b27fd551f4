"""The offset-aware FreeSolo entries (`q_start`): queries of `[a, b)` over keys of `[0, b)` give
rows `[a, b)` of the whole-sequence call, forward and gradients, for FS and FS-L."""

from __future__ import annotations

import pytest
import torch

from fsframework.models.freesolo_settings import fs_config, fs_pair
from fsframework.ops.freesolo import cell_readout, long_range_attention, select_cells

KW = dict(cell_size=4, block_size=16, top_k=2, recent_cells=2, retained_cells=3, impl="reference")


def _inputs(n: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, n, 3, 8, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3)]


@pytest.mark.parametrize("variant", ["fs", "fsl"])
@pytest.mark.parametrize("n, start", [(100, 48), (100, 96), (37, 32), (64, 16)], ids=str)
def test_offset_call_equals_rows_of_the_whole_call(variant, n, start):
    q, k, v = _inputs(n)
    full = long_range_attention(q, k, v, *fs_pair(variant=variant, **KW))
    grad = torch.randn_like(full)
    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    cells = select_cells(q2[:, start:], k2, *fs_pair(variant=variant, **KW), q_start=start)
    assert torch.equal(cells, select_cells(q, k, *fs_pair(variant=variant, **KW))[:, start:])
    part = long_range_attention(q2[:, start:], k2, v2, *fs_pair(variant=variant, **KW), q_start=start)
    torch.testing.assert_close(part, full[:, start:], rtol=1e-12, atol=1e-12)
    # only the own queries' loss: the earlier rows' contributions to dk, dv are missing by design
    (part * grad[:, start:]).sum().backward()
    q3, k3, v3 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    rows = long_range_attention(q3, k3, v3, *fs_pair(variant=variant, **KW))
    (rows[:, start:] * grad[:, start:]).sum().backward()
    for got, ref in zip((q2.grad, k2.grad, v2.grad), (q3.grad, k3.grad, v3.grad)):
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


def test_offset_must_be_block_aligned_and_shapes_consistent():
    q, k, v = _inputs(64)
    with pytest.raises(ValueError, match="multiple of block_size=16"):
        long_range_attention(q[:, 20:], k, v, *fs_pair(**KW), q_start=20)
    with pytest.raises(ValueError, match="needs keys"):
        long_range_attention(q[:, 32:], k[:, :40], v[:, :40], *fs_pair(**KW), q_start=32)
    with pytest.raises(ValueError, match="needs keys"):
        cell_readout(q[:, 32:], k[:, :40], v[:, :40], torch.zeros(2, 32, 3, 2, dtype=torch.long),
                     fs_config(cell_size=4), q_start=32)


def test_triton_kernels_take_the_offset_through_padding():
    pytest.importorskip("fsf_kernels.cell_routing")
    q, k, v = (t.detach().float() for t in _inputs(64))
    kw = {**KW, "impl": "triton"}
    want = long_range_attention(q, k, v, *fs_pair(**KW))[:, 32:]
    got = long_range_attention(q[:, 32:], k, v, *fs_pair(**kw), q_start=32)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
