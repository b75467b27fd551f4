"""Triton runway-rewired attention vs the reference (fsframework.ops.rewired): forward and the
gradients of q, k, v, u and Bmat, fp32 and bf16, with and without a query offset; packed documents
(`positions`) vs the reference with the same positions, document boundaries inside and across tiles,
one launch per kernel however many documents."""

import importlib

import pytest
import torch

from fsframework.ops.rewired import RewiredSettings, rewired_attention, rewired_attention_rows as reference
from fsf_kernels.rewired_attention import rewired_attention_rows
from kernel_testing import assert_close, gpu, kernel_launches, needs_cuda
from tests.utils import positions_of

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
    _compare([x.to(device, dtype) for x in (q, k, v, r, u)], grad, q_start=start)


def _compare(inputs: list, grad: torch.Tensor, **call) -> None:
    """The kernel against the reference, both called with `call`: the output and the gradients of q, k,
    v, r and u (the reference in fp32, at the inputs' dtype's tolerance)."""
    dtype = inputs[0].dtype
    inputs = [x.requires_grad_() for x in inputs]
    out = rewired_attention_rows(*inputs, **call)
    got = torch.autograd.grad(out, inputs, grad)
    ref_in = [x.detach().float().requires_grad_() for x in inputs]
    ref = reference(*ref_in, **call)
    want = torch.autograd.grad(ref, ref_in, grad.float())
    assert out.dtype == dtype and out.shape == inputs[0].shape
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
    module = importlib.import_module("fsf_kernels.rewired_attention.rewired_attention")
    monkeypatch.setattr(module, "device_target", lambda device: 86)
    assert module.tiles(BF16, 128, 86) == 32
    _check((1, 40, 1, 128, 30, BF16), device)


# packed documents (`positions`): every document of a row read as a row of its own, in one launch per kernel

KERNELS = ("rewired_fwd_kernel", "rewired_bwd_dkdvdu_kernel", "rewired_bwd_dqdr_kernel")


def _module():
    return importlib.import_module("fsf_kernels.rewired_attention.rewired_attention")


# (rows of document lengths, D, dtype, tile): 70 tokens in 64-row tiles put every boundary of the first
# tile inside it and leave a partial second one; 16-row tiles put documents across tiles, so a query
# tile starts its keys after the row's start and a key tile stops its queries before the row's end
# (query 16, a tile's first, ends a document begun in the tile before; key 31, a tile's last, starts one)
DOC_CPU_CASES = [
    ([[1, 2, 17, 50], [33, 1, 2, 34]], 16, F32, None),
    ([[1, 2, 17, 50], [33, 1, 2, 34]], 16, BF16, None),
    ([[20, 1, 2, 22], [17, 28], [2, 29, 14]], 16, F32, 16),
]
DOC_GPU_CASES = [
    ([[1, 2, 300, 421, 300], [1000, 24]], 64, BF16, None),
    ([[5] * 100 + [523]], 128, BF16, None),
    ([[333, 1, 2, 441]], 64, F32, None),
]


def _doc_id(case):
    rows, dim, dtype, tile = case
    return f"T{sum(rows[0])}-docs{'x'.join(str(len(r)) for r in rows)}-d{dim}-{str(dtype).split('.')[-1]}" + \
        (f"-tile{tile}" if tile else "")


def _check_documents(case, device, monkeypatch):
    rows, dim, dtype, tile = case
    if tile:
        monkeypatch.setattr(_module(), "_TILE", tile)
    bsz, total, heads = len(rows), sum(rows[0]), 2
    pos = positions_of(rows).to(device)
    gen = torch.Generator().manual_seed(total * 7 + dim)
    q, k, v = (torch.randn(bsz, total, heads, dim, generator=gen) for _ in range(3))
    r = torch.randn(bsz, total, dim, generator=gen) * 0.5
    u = torch.randn(bsz, total, dim, generator=gen) * 0.5
    grad = torch.randn(bsz, total, heads, dim, generator=gen).to(device, dtype)
    _compare([x.to(device, dtype) for x in (q, k, v, r, u)], grad, positions=pos)


@pytest.mark.parametrize("case", DOC_CPU_CASES, ids=_doc_id)
def test_documents_match_reference(case, device, monkeypatch):
    _check_documents(case, device, monkeypatch)


@gpu
@needs_cuda
@pytest.mark.parametrize("case", DOC_GPU_CASES, ids=_doc_id)
def test_documents_match_reference_gpu(case, monkeypatch):
    _check_documents(case, "cuda", monkeypatch)


@pytest.mark.parametrize("runway", ["last", "mean"])
def test_op_dispatches_here_with_documents(runway, device):
    """The op's impl="triton" with positions reaches the DOCS kernels; gradients reach u and Bmat through
    the documents' runway rows."""
    gen = torch.Generator().manual_seed(5)
    rows = [[1, 2, 17, 20], [25, 15]]
    q, k, v = (torch.randn(2, 40, 2, 16, generator=gen).to(device) for _ in range(3))
    u = (0.5 * torch.randn(2, 40, 16, generator=gen)).to(device)
    bmat = (torch.eye(16) + 0.2 * torch.randn(16, 16, generator=gen)).to(device)
    pos = positions_of(rows).to(device)
    grads = []
    for impl in ("triton", "reference"):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, u, bmat)]
        out = rewired_attention(*leaves[:4], settings=RewiredSettings(runway=runway), bmat=leaves[4], impl=impl,
                                positions=pos)
        grads.append((out, *torch.autograd.grad(out.square().sum(), leaves)))
    for name, g, w in zip(("out", "dq", "dk", "dv", "du", "dbmat"), *grads):
        assert_close(g, w, torch.float32, name)


def test_one_launch_per_kernel_however_many_documents(monkeypatch, device):
    gen = torch.Generator().manual_seed(3)
    x = [torch.randn(1, 48, 2, 16, generator=gen) for _ in range(3)] + [torch.randn(1, 48, 16, generator=gen)]

    def step(rows):
        leaves = [t.to(device).requires_grad_() for t in x]
        pos = None if rows is None else positions_of(rows).to(device)
        out = rewired_attention(*leaves, settings=RewiredSettings(runway="mean"), impl="triton", positions=pos)
        torch.autograd.grad(out.sum(), leaves)

    def launches(rows):  # of the three rewired kernels, by (name, DOCS)
        return {key: n for key, n in kernel_launches(monkeypatch, lambda: step(rows)).items() if key[0] in KERNELS}

    assert launches([[48]]) == launches([[1, 2, 3, 4, 5, 6, 7, 20]]) == {(name, True): 1 for name in KERNELS}
    assert launches(None) == {(name, False): 1 for name in KERNELS}


def test_document_bounds():
    first, stop = _module().document_bounds(positions_of([[1, 3, 2], [6]]))
    assert first.dtype == stop.dtype == torch.int32 and first.is_contiguous() and stop.is_contiguous()
    assert first.tolist() == [[0, 1, 1, 1, 4, 4], [0] * 6]
    assert stop.tolist() == [[1, 4, 4, 4, 6, 6], [6] * 6]


def test_bad_positions():
    x, r = torch.randn(1, 8, 2, 16), torch.randn(1, 8, 16)
    with pytest.raises(ValueError, match="q_start must be 0"):
        rewired_attention_rows(x[:, 2:], x, x, r[:, 2:], r, q_start=2, positions=positions_of([[6]]))
    with pytest.raises(ValueError, match="positions must be an integer tensor"):
        rewired_attention_rows(x, x, x, r, r, positions=positions_of([[8]]).float())
    with pytest.raises(ValueError, match="a row's first token starts a document"):
        rewired_attention_rows(x, x, x, r, r, positions=positions_of([[8]]) + 1)
