"""Triton runway-rewired attention vs the reference (fsframework.ops.rewired): forward and the
gradients of q, k, v, u and Bmat, fp32 and bf16, with and without a query offset."""

import pytest
import torch

from fsframework.ops.rewired import RewiredSettings, rewired_attention, rewired_attention_rows as reference
from fsf_kernels.rewired_attention import rewired_attention_rows
from kernel_testing import assert_close, gpu, needs_cuda

F32, BF16 = torch.float32, torch.bfloat16

# (B, n, H, D, q_start, dtype): tiles of 64, so 70 queries leave a partial tile and
# q_start = 50 puts a tile boundary inside the prefix; fp32 at D = 128 runs tiles of 32
CPU_CASES = [
    (1, 70, 2, 16, 0, F32),
    (2, 20, 1, 32, 50, F32),
    (1, 70, 2, 16, 0, BF16),
    (1, 40, 1, 128, 30, F32),
]
GPU_CASES = [
    (2, 1024, 8, 64, 0, BF16),
    (1, 1000, 4, 128, 300, BF16),
    (1, 777, 2, 64, 0, F32),
]


def _id(case):
    b, n, h, d, start, dt = case
    return f"B{b}-n{n}-H{h}-d{d}-s{start}-{str(dt).split('.')[-1]}"


def _check(case, device):
    bsz, n, heads, dim, start, dtype = case
    total = start + n
    gen = torch.Generator().manual_seed(n * 7 + dim)
    q = torch.randn(bsz, n, heads, dim, generator=gen)
    k, v = (torch.randn(bsz, total, heads, dim, generator=gen) for _ in range(2))
    r = torch.randn(bsz, n, dim, generator=gen) * 0.5
    u = torch.randn(bsz, total, dim, generator=gen) * 0.5
    grad = torch.randn(bsz, n, heads, dim, generator=gen).to(device, dtype)
    inputs = [x.to(device, dtype).requires_grad_() for x in (q, k, v, r, u)]
    out = rewired_attention_rows(*inputs, q_start=start)
    got = torch.autograd.grad(out, inputs, grad)
    ref_in = [x.detach().float().requires_grad_() for x in inputs]
    ref = reference(*ref_in, q_start=start)
    want = torch.autograd.grad(ref, ref_in, grad.float())
    assert out.dtype == dtype and out.shape == q.shape
    assert_close(out, ref, dtype, "out")
    for name, g, w in zip(("dq", "dk", "dv", "dr", "du"), got, want):
        assert g.dtype == dtype
        assert_close(g, w, dtype, name)


@pytest.mark.parametrize("case", CPU_CASES, ids=_id)
def test_matches_reference(case, device):
    _check(case, device)


@gpu
@needs_cuda
@pytest.mark.parametrize("case", GPU_CASES, ids=_id)
def test_matches_reference_gpu(case):
    _check(case, "cuda")


def test_op_dispatches_here_with_mean_runway_and_bmat(device):
    """The op's impl="triton" reaches this kernel; gradients reach u and Bmat through the bias rows."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 40, 2, 16, generator=gen).to(device) for _ in range(3))
    u = (0.5 * torch.randn(1, 40, 16, generator=gen)).to(device)
    bmat = (torch.eye(16) + 0.2 * torch.randn(16, 16, generator=gen)).to(device)
    grads = []
    for impl in ("triton", "reference"):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, u, bmat)]
        out = rewired_attention(*leaves[:4], settings=RewiredSettings(runway="mean"), bmat=leaves[4], impl=impl)
        grads.append((out, *torch.autograd.grad(out.square().sum(), leaves)))
    for name, g, w in zip(("out", "dq", "dk", "dv", "du", "dbmat"), *grads):
        assert_close(g, w, torch.float32, name)


def test_backward_is_deterministic(device):
    inputs = [torch.randn(1, 70, 2, 16, device=device).requires_grad_() for _ in range(3)]
    inputs += [torch.randn(1, 70, 16, device=device).requires_grad_() for _ in range(2)]
    runs = [torch.autograd.grad(rewired_attention_rows(*inputs).sum(), inputs) for _ in range(2)]
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_bad_shapes():
    x = torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match="r must be"):
        rewired_attention_rows(x, x, x, torch.randn(1, 8, 15), torch.randn(1, 8, 16))


def test_the_small_shared_memory_tiles(monkeypatch, device):
    """GPUs with 101,376 B per block (sm_86 class) run tiles of 32 rows for bf16 at d = 128 (64
    elsewhere; `fsf_kernels.rewired_attention.rewired_attention.tiles`); same results."""
    import importlib

    module = importlib.import_module("fsf_kernels.rewired_attention.rewired_attention")
    monkeypatch.setattr(module, "device_target", lambda device: 86)
    assert module.tiles(BF16, 128, 86) == 32
    _check((1, 40, 1, 128, 30, BF16), device)
