"""Runway-rewired attention reference (fsframework.ops.rewired) against a dense N x N definition
written here from docs/rewired.md §2, forward and gradients; offset rows; bad input."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fsframework.ops.rewired import RewiredSettings, rewired_attention
from tests.work import WorkCounter


def dense(q, k, v, u, runway="last", bmat=None):
    """The definition, whole matrix at once: logits + bias (m < t-1), 0 at m in {t-1, t}, causal."""
    n, dim = q.shape[1], q.shape[-1]
    if runway == "last":
        r = torch.cat((torch.zeros_like(u[:, :1]), u[:, :-1]), dim=1)  # r_t = u_{t-1}
    else:
        counts = torch.arange(1, n, dtype=u.dtype)[None, :, None]
        r = torch.cat((torch.zeros_like(u[:, :1]), torch.cumsum(u, 1)[:, :-1] / counts), dim=1)
    tau = torch.einsum("bid,de,bje->bij", r, torch.eye(dim, dtype=u.dtype) if bmat is None else bmat, u)
    t = torch.arange(n)[:, None]
    m = torch.arange(n)[None, :]
    bias = torch.where(m < t - 1, -F.softplus(tau), torch.zeros_like(tau)).masked_fill(m > t, -math.inf)
    logits = torch.einsum("bthd,bmhd->bhtm", q, k) / math.sqrt(dim) + bias[:, None]
    return torch.einsum("bhtm,bmhd->bthd", logits.softmax(-1), v)


def _inputs(bsz, n, heads, dim, bilinear, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(bsz, n, heads, dim, generator=gen, dtype=torch.float64) for _ in range(3))
    u = torch.randn(bsz, n, dim, generator=gen, dtype=torch.float64) * 0.7
    bmat = torch.eye(dim, dtype=torch.float64) + 0.3 * torch.randn(dim, dim, generator=gen, dtype=torch.float64) \
        if bilinear else None
    return [x.requires_grad_() for x in (q, k, v, u)] + [None if bmat is None else bmat.requires_grad_()]


@pytest.mark.parametrize("runway", ["last", "mean"])
@pytest.mark.parametrize("bilinear", [False, True], ids=["dot", "bilinear"])
def test_matches_dense_definition_forward_and_gradients(runway, bilinear):
    # 300 queries: three query tiles, the last one partial
    q, k, v, u, bmat = _inputs(2, 300, 3, 8, bilinear)
    leaves = [x for x in (q, k, v, u, bmat) if x is not None]
    got = rewired_attention(q, k, v, u, settings=RewiredSettings(runway=runway), bmat=bmat, impl="reference")
    want = dense(q, k, v, u, runway, bmat)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    grad = torch.randn_like(want)
    g_got = torch.autograd.grad(got, leaves, grad)
    g_want = torch.autograd.grad(want, leaves, grad)
    for name, a, b in zip("q k v u bmat".split(), g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=lambda m: f"d{name}: {m}")
    assert g_got[3].abs().sum() > 0  # the bias really reaches u


def test_bias_exemptions_and_dot_default():
    """m = t-1 and m = t carry no bias: with two positions the op is plain causal attention."""
    q, k, v, u, _ = _inputs(1, 2, 2, 4, False)
    plain = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=True).transpose(1, 2)
    torch.testing.assert_close(rewired_attention(q, k, v, u * 100, impl="reference"), plain)
    # a large u makes softplus(tau) large for m < t - 1 at position 2 only when tau > 0: compare with dense
    q, k, v, u, _ = _inputs(1, 3, 1, 4, False, seed=3)
    torch.testing.assert_close(rewired_attention(q, k, v, u * 5, settings=RewiredSettings(score="dot"),
                                                 impl="reference"),
                               dense(q, k, v, u * 5))


@pytest.mark.parametrize("runway", ["last", "mean"])
def test_offset_rows_equal_whole_call(runway):
    q, k, v, u, bmat = _inputs(1, 200, 2, 8, True, seed=1)
    with torch.no_grad():
        whole = rewired_attention(q, k, v, u, settings=RewiredSettings(runway=runway), bmat=bmat, impl="reference")
        for start in (0, 1, 77, 199):
            part = rewired_attention(q[:, start:], k, v, u, settings=RewiredSettings(runway=runway), bmat=bmat,
                                     impl="reference", q_start=start)
            torch.testing.assert_close(part, whole[:, start:], rtol=1e-12, atol=1e-12)


def test_half_inputs_keep_dtype():
    q, k, v, u, _ = _inputs(1, 40, 2, 8, False)
    args = [x.detach().to(torch.bfloat16) for x in (q, k, v, u)]
    out = rewired_attention(*args, settings=RewiredSettings(runway="mean"), impl="reference")
    assert out.dtype == torch.bfloat16
    want = dense(*(x.double() for x in args), "mean")
    assert (out.double() - want).abs().max() < 3e-2


@pytest.mark.parametrize("change, match", [
    (dict(u=(1, 10, 7)), r"u \(the runway head's values\) must have shape"),
    (dict(u=(1, 9, 8)), "u .* must have shape"),
    (dict(bmat=(8, 4)), r"bmat must be \[d, d\]"),
    (dict(runway="first"), "runway must be one of"),
    (dict(score="bilinear"), "needs bmat"),
    (dict(score="cosine"), "score must be one of"),
    (dict(k=(1, 11, 2, 8)), "need k and v of shape"),
    (dict(q_start=-1), "q_start"),
], ids=["u-width", "u-length", "bmat-shape", "runway", "bilinear-without-bmat", "score", "k-length", "q_start"])
def test_bad_input_names_the_problem(change, match):
    shapes = dict(q=(1, 10, 2, 8), k=(1, 10, 2, 8), u=(1, 10, 8), bmat=None)
    shapes.update({key: val for key, val in change.items() if key in shapes})
    q, k = torch.randn(shapes["q"]), torch.randn(shapes["k"])
    u = torch.randn(shapes["u"])
    bmat = None if shapes["bmat"] is None else torch.randn(shapes["bmat"])
    settings = RewiredSettings(**{key: val for key, val in change.items() if key in ("runway", "score")})
    with pytest.raises(ValueError, match=match):
        rewired_attention(q, k, k, u, settings=settings, bmat=bmat, impl="reference", q_start=change.get("q_start", 0))


def test_reference_never_forms_an_n_by_n_tensor():
    """Forward and backward at N = 600 with 128-query tiles: no intermediate reaches N x N / 2 elements."""
    n = 600
    q, k, v, u, bmat = _inputs(1, n, 1, 4, True)
    with WorkCounter() as work:
        out = rewired_attention(q, k, v, u, settings=RewiredSettings(runway="mean"), bmat=bmat, impl="reference")
        torch.autograd.grad(out.sum(), (q, k, v, u, bmat))
    # the largest is one tile's logits: 128 queries over the 512 keys of the fourth tile
    assert work.largest == 128 * 512 < n * n // 2
