"""Triton sliding-window attention vs fsframework.ops.local_attention (reference): forward and dq, dk, dv;
packed documents (`positions`) against the reference's, in one launch per kernel however many documents."""

import pytest
import torch

from fsframework.ops.local_attention import sliding_window_attention as reference
from fsframework.ops.rope import rotate, rotate_at
from fsf_kernels.window_attention import sliding_window_attention
from kernel_testing import assert_close, gpu, kernel_launches, needs_cuda
from tests.utils import positions_of

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

# (B, N, H, D, window, rope_theta, start_pos, dtype)
CPU_CASES = [
    (1, 63, 2, 32, 16, 10000.0, 0, F32),
    (2, 200, 1, 64, 50, None, 0, F32),
    (1, 200, 1, 48, 70, 10000.0, 7, F32),
    (1, 1000, 1, 32, 100, 10000.0, 0, F32),
    (1, 70, 1, 128, 200, 500.0, 3, F32),
    (1, 63, 1, 32, 0, 10000.0, 0, F32),
    (1, 130, 2, 32, 40, 10000.0, 0, F16),
    (1, 130, 1, 64, 40, 10000.0, 0, BF16),
]
GPU_CASES = [
    (2, 4096, 4, 64, 512, 10000.0, 0, BF16),
    (1, 4099, 2, 128, 512, 10000.0, 100, BF16),
    (1, 2048, 4, 32, 300, 10000.0, 0, F16),
    (1, 1000, 2, 64, 512, None, 0, F32),
    # the tile changes of `fsf_kernels.common.support.window_tiles`: d = 256 (2 stages on sm_90,
    # 32 x 32 on sm_80) and fp32 at d = 128 (32 x 32)
    (1, 1500, 2, 256, 512, 10000.0, 0, BF16),
    (1, 1000, 2, 128, 300, 10000.0, 0, F32),
]


def _id(case):
    b, n, h, d, w, theta, start, dt = case
    rope = "norope" if theta is None else f"rope{int(theta)}"
    return f"B{b}-N{n}-H{h}-d{d}-w{w}-{rope}-s{start}-{str(dt).split('.')[-1]}"


def _check(case, device):
    bsz, seq, heads, dim, window, theta, start, dtype = case
    gen = torch.Generator().manual_seed(seq * 31 + dim)
    q, k, v = (torch.randn(bsz, seq, heads, dim, generator=gen).to(device, dtype).requires_grad_() for _ in range(3))
    grad = torch.randn(bsz, seq, heads, dim, generator=gen).to(device, dtype)
    _compare(q, k, v, grad, window=window, theta=theta, start=start)


def _compare(q, k, v, grad, *, window, theta, start=0, positions=None) -> None:
    """The kernel against the reference in fp32 from the same (rounded) inputs, output and gradients;
    in half precision judged beside plain PyTorch's own rounding (`_in_low_precision`)."""
    dtype = q.dtype
    at = {"start_pos": start} if positions is None else {"positions": positions}
    out = sliding_window_attention(q, k, v, window=window, rope_theta=theta, **at)
    got = torch.autograd.grad(out, (q, k, v), grad)
    q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
    ref = reference(q32, k32, v32, window=window, rope_theta=theta, impl="reference", **at)
    want = torch.autograd.grad(ref, (q32, k32, v32), grad.float())
    assert out.dtype == dtype and out.shape == q.shape
    base, base_grads = None, (None,) * 3
    if dtype != F32:
        qh, kh, vh = (x.detach().requires_grad_() for x in (q, k, v))
        base = _in_low_precision(qh, kh, vh, window=window, theta=theta, start=start, positions=positions)
        base_grads = torch.autograd.grad(base, (qh, kh, vh), grad)
    assert_close(out, ref, dtype, "out", base)
    for name, g, w, b in zip(("dq", "dk", "dv"), got, want, base_grads):
        assert g.dtype == dtype
        assert_close(g, w, dtype, name, b)


def _in_low_precision(q, k, v, *, window, theta, start, positions=None):
    """The same attention as plain PyTorch computes it in the inputs' half precision (scores,
    softmax and products in that dtype, dense over the band): the yardstick of a half-precision
    kernel's rounding (`assert_close`'s baseline). `positions`: packed documents, as the op's."""
    if theta is not None and positions is not None:
        q, k = rotate_at(q, theta, positions), rotate_at(k, theta, positions)
    elif theta is not None:
        q, k = rotate(q, theta, start), rotate(k, theta, start)
    pos = torch.arange(q.shape[1], device=q.device)
    band = (pos[:, None] >= pos[None, :]) & (pos[:, None] - pos[None, :] <= window)
    if positions is not None:  # [B, 1, T, T]: each query within its document
        band = band & (pos[None, None, :] >= (pos - positions)[:, :, None])[:, None]
    logits = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    probs = torch.softmax(logits.masked_fill(~band, float("-inf")), dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", probs, v)


@pytest.mark.parametrize("case", CPU_CASES, ids=_id)
def test_matches_reference(case, device):
    _check(case, device)


@gpu
@needs_cuda
@pytest.mark.parametrize("case", GPU_CASES, ids=_id)
def test_matches_reference_gpu(case):
    _check(case, "cuda")


def test_strided_inputs(device):
    """q/k/v sliced out of a fused qkv projection (non-contiguous) give the same result."""
    qkv = torch.randn(1, 100, 3, 2, 32, device=device)
    q, k, v = qkv.unbind(2)
    out = sliding_window_attention(q, k, v, window=20)
    ref = reference(q, k, v, window=20, impl="reference")
    assert_close(out, ref, torch.float32, "out")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(shape=(1, 8, 1, 16), window=-1), "window"),
        (dict(shape=(1, 8, 1, 15), window=4), "even"),
        (dict(shape=(8, 1, 16), window=4), "shape"),
    ],
    ids=["negative-window", "odd-dim-rope", "3d-input"],
)
def test_bad_sizes(kwargs, match):
    x = torch.randn(*kwargs["shape"])
    with pytest.raises(ValueError, match=match):
        sliding_window_attention(x, x, x, window=kwargs["window"])


def test_conftest_poisons_empty_outputs():
    """Guards the NaN fill itself: without it an unwritten output could pass by luck."""
    from fsf_kernels.window_attention import window_attention as module

    assert module.torch.empty(3).isnan().all()


def test_reference_module_dispatches_here(device):
    """fsframework's impl="triton" path reaches this kernel by its pinned name."""
    q, k, v = (torch.randn(1, 40, 1, 16, device=device) for _ in range(3))
    got = reference(q, k, v, window=8, impl="triton")
    assert_close(got, reference(q, k, v, window=8, impl="reference"), torch.float32, "out")


def test_the_small_shared_memory_tiles(monkeypatch, device):
    """GPUs with 101,376 B per block (sm_86 class) run smaller tiles: fp32 at d = 256 in 16 x 16
    (`fsf_kernels.common.support.window_tiles`); same results."""
    import importlib

    module = importlib.import_module("fsf_kernels.window_attention.window_attention")
    monkeypatch.setattr(module, "device_target", lambda device: 86)
    _check((1, 45, 1, 256, 20, 10000.0, 0, F32), device)


# --- packed documents (positions) ---


# (rows' document lengths, H, D, window, rope_theta, dtype, tiles (query rows, key rows) or None for the
# launcher's own): boundaries inside tiles, documents longer and shorter than the window, 1-token
# documents, rows of different documents, T not a multiple of the tiles; the small tiles make the key
# loop start at the document (`first` of a tile's first query) in most tiles
DOC_CASES = [
    ([[5, 30, 1, 11, 20]], 2, 16, 12, 10000.0, F32, None),
    ([[40, 3, 1, 26], [1, 69]], 2, 16, 50, None, F32, None),
    ([[9, 1, 1, 24, 19], [54]], 2, 16, 40, 10000.0, F32, (16, 16)),
    ([[20, 2, 21], [1, 1, 41]], 2, 16, 6, 500.0, F32, (16, 32)),
    ([[17, 1, 45]], 2, 16, 20, 10000.0, BF16, (32, 16)),
    ([[30, 35], [3, 62]], 2, 32, 16, 10000.0, F16, None),
]
GPU_DOC_CASES = [
    ([[1000, 1, 600, 2495], [4096]], 4, 64, 512, 10000.0, BF16, None),
    ([[3000, 1, 1, 1096], [1, 4095]], 2, 128, 512, None, F32, None),
]


def _doc_id(case):
    rows, heads, dim, window, theta, dtype, tiles = case
    rope = "norope" if theta is None else f"rope{int(theta)}"
    tile = "own" if tiles is None else "x".join(map(str, tiles))
    return f"docs{'+'.join(str(len(r)) for r in rows)}-T{sum(rows[0])}-d{dim}-w{window}-{rope}-tiles{tile}-" \
           f"{str(dtype).split('.')[-1]}"


@pytest.mark.parametrize("case", DOC_CASES, ids=_doc_id)
def test_documents_match_the_reference(case, device, monkeypatch):
    _check_documents(case, device, monkeypatch)


@gpu
@needs_cuda
@pytest.mark.parametrize("case", GPU_DOC_CASES, ids=_doc_id)
def test_documents_match_the_reference_gpu(case, monkeypatch):
    _check_documents(case, "cuda", monkeypatch)


def _check_documents(case, device, monkeypatch):
    rows, heads, dim, window, theta, dtype, tiles = case
    if tiles is not None:
        import importlib

        module = importlib.import_module("fsf_kernels.window_attention.window_attention")
        monkeypatch.setattr(module, "window_tiles", lambda *args: (*tiles, 3))
    bsz, seq = len(rows), sum(rows[0])
    positions = positions_of(rows).to(device)
    gen = torch.Generator().manual_seed(seq * 7 + window)
    q, k, v = (torch.randn(bsz, seq, heads, dim, generator=gen).to(device, dtype).requires_grad_() for _ in range(3))
    grad = torch.randn(bsz, seq, heads, dim, generator=gen).to(device, dtype)
    _compare(q, k, v, grad, window=window, theta=theta, positions=positions)


def test_one_launch_per_kernel_however_many_documents(monkeypatch, device):
    q, k, v = (torch.randn(2, 48, 2, 16, device=device, requires_grad=True) for _ in range(3))

    def step(rows):
        positions = None if rows is None else positions_of(rows).to(device)
        sliding_window_attention(q, k, v, window=8, rope_theta=None, positions=positions).sum().backward()

    one = kernel_launches(monkeypatch, lambda: step([[48], [48]]))
    many = kernel_launches(monkeypatch, lambda: step([[1, 7, 3, 12, 1, 1, 23], [5, 6, 7, 8, 22]]))
    assert one == many == {("window_attention_fwd_kernel", True): 1, ("softmax_bwd_delta_kernel", None): 1,
                           ("window_attention_bwd_dkdv_kernel", True): 1, ("window_attention_bwd_dq_kernel", True): 1}
    # without positions, the same launches of the variant without documents
    assert kernel_launches(monkeypatch, lambda: step(None)) == {(name, None if docs is None else False): n
                                                         for (name, docs), n in one.items()}


def test_bad_positions_are_refused():
    x = torch.randn(1, 6, 1, 16)
    with pytest.raises(ValueError, match="start_pos"):
        sliding_window_attention(x, x, x, window=2, start_pos=3, positions=torch.zeros(1, 6, dtype=torch.long))
    with pytest.raises(ValueError, match=r"positions\[0, 2\]"):
        sliding_window_attention(x, x, x, window=2, positions=torch.tensor([[0, 1, 3, 4, 5, 6]]))
