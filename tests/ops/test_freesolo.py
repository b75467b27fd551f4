"""FreeSolo long-range ops against brute-force dense definitions (docs/freesolo.md §1.3-§1.6) and the
properties of docs/freesolo.md §1.11. Brute-force helpers build full score matrices and `N x N` masks,
so they only run at small N."""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch

from fsframework.models.freesolo_settings import fs_config, fs_pair, fs_prior
from fsframework.ops import freesolo_readout
from fsframework.ops.freesolo import cell_readout, long_range_attention, select_cells
from tests.work import WorkCounter

F64 = torch.float64


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def randn(*shape, seed=0, dtype=F64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def dense_scores(q, k, *, variant, s, blk, sigma, lam, W=0, P=0, gate_one=False):
    """Full routing scores `[Bt, N, H, C]` and availability mask, straight from the definitions (docs/freesolo.md)."""
    bsz, seq, heads, dim = q.shape
    cells = seq // s
    kbar = torch.stack([k[:, c * s:(c + 1) * s].mean(1) for c in range(cells)], 1)  # Bt C H d
    a = torch.stack([k[:, c * s:(c + 1) * s].norm(dim=-1).amax(1) for c in range(cells)], 1)  # Bt C H
    sigma = torch.as_tensor(sigma, dtype=F64).expand(heads)
    lam = torch.as_tensor(lam, dtype=F64).expand(heads)
    i = torch.arange(seq, dtype=F64)[:, None]
    p = (torch.arange(cells, dtype=F64) + 0.5) * s
    gate = torch.erf((i - p)[:, None, :] / (2 * sigma[:, None]))  # N H C
    if gate_one:
        gate = torch.ones_like(gate)
    content = torch.einsum("bihd,bchd->bihc", q, kbar) / math.sqrt(dim)
    scores = content + lam[:, None] * a.transpose(1, 2)[:, None] * gate
    avail = torch.zeros(bsz, seq, heads, cells, dtype=torch.bool)
    for i0 in range(0, seq, blk):
        n = i0 // s  # |C_i|
        if variant == "fs":
            avail[:, i0:i0 + blk, :, :n] = True
            continue
        avail[:, i0:i0 + blk, :, max(0, n - W):n] = True
        for b in range(bsz):
            for h in range(heads):
                order = sorted(range(n), key=lambda c: (-a[b, c, h].item(), c))  # ties: earlier cell
                avail[b, i0:i0 + blk, h, order[:P]] = True
    return scores, avail, a, p


def dense_select(q, k, *, variant, s, blk, K, sigma=4.0, lam=1.0, W=0, P=0):
    scores, avail, _, _ = dense_scores(q, k, variant=variant, s=s, blk=blk, sigma=sigma, lam=lam, W=W, P=P)
    masked = scores.masked_fill(~avail, float("-inf"))
    val, idx = masked.sort(dim=-1, descending=True, stable=True)  # stable: ties go to the earlier cell
    pad = max(0, K - idx.shape[-1])
    val = torch.nn.functional.pad(val, (0, pad), value=float("-inf"))[..., :K]
    idx = torch.nn.functional.pad(idx, (0, pad), value=-1)[..., :K]
    return torch.where(val > float("-inf"), idx, -1)


def dense_readout(q, k, v, cells, *, s, weight=None, eps=1e-8):
    """Masked `N x N` attention over the tokens of the selected cells, then RMSNorm."""
    seq, dim = q.shape[1], q.shape[-1]
    tok_cell = torch.arange(seq) // s
    tok_cell = torch.where(torch.arange(seq) < (seq // s) * s, tok_cell, -2)  # incomplete tail: never selected
    mask = (cells[..., None] == tok_cell).any(-2).transpose(1, 2)  # Bt H N N
    logits = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(dim)
    empty = ~mask.any(-1, keepdim=True)
    probs = torch.softmax(logits.masked_fill(~mask, float("-inf")).masked_fill(empty, 0.0), -1)
    y = torch.einsum("bhij,bjhd->bihd", probs.masked_fill(empty, 0.0), v)
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight


CONFIGS = [  # (s, B, K, P, W)
    pytest.param((4, 16, 3, 5, 2), id="s4-B16-K3-P5-W2"),
    pytest.param((4, 8, 2, 3, 1), id="s4-B8-K2-P3-W1"),
    pytest.param((3, 9, 4, 2, 0), id="s3-B9-K4-P2-W0"),
    pytest.param((8, 32, 1, 0, 3), id="s8-B32-K1-P0-W3"),
]


@pytest.mark.parametrize("variant", ["fs", "fsl"])
@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("heads", [1, 3], ids=lambda h: f"H{h}")
@pytest.mark.parametrize("seq", [63, 200, 333], ids=lambda n: f"N{n}")
def test_select_cells_matches_dense(variant, cfg, heads, seq):
    s, blk, K, P, W = cfg
    q, k = randn(2, seq, heads, 6, seed=seq), randn(2, seq, heads, 6, seed=seq + 1) * 1.5
    sigma, lam = torch.linspace(1.0, 6.0, heads, dtype=F64), torch.linspace(0.5, 2.0, heads, dtype=F64)
    got = select_cells(q, k,
                       fs_config(variant, cell_size=s, block_size=blk, top_k=K, recent_cells=W, retained_cells=P),
                       fs_prior(sigma=sigma, lam=lam))
    want = dense_select(q, k, variant=variant, s=s, blk=blk, K=K, sigma=sigma, lam=lam, W=W, P=P)
    assert got.shape == (2, seq, heads, K) and got.dtype == torch.long
    assert torch.equal(got, want)


@pytest.fixture(params=["union", "gather"])
def readout_layout(request, monkeypatch):
    """Force one of the two exact readout layouts (and small chunks, so several are used)."""
    monkeypatch.setattr(freesolo_readout, "_UNION_FACTOR", 10**6 if request.param == "union" else 0)
    monkeypatch.setattr(freesolo_readout, "_CHUNK_ELEMENTS", 1 << 14)
    return request.param


@pytest.mark.parametrize("variant", ["fs", "fsl"])
@pytest.mark.parametrize("weight_shape", ["HD", "D", "none"])
@pytest.mark.parametrize("heads,seq", [(1, 63), (3, 200)], ids=["H1-N63", "H3-N200"])
def test_long_range_forward_and_grads_match_dense(variant, weight_shape, heads, seq, readout_layout):
    s, blk, K, dim = 4, 16, 3, 8
    q, k, v = (randn(2, seq, heads, dim, seed=i).requires_grad_() for i in range(3))
    weight = {"HD": randn(heads, dim, seed=7), "D": randn(dim, seed=7), "none": None}[weight_shape]
    if weight is not None:
        weight.requires_grad_()
    kw = dict(variant=variant, cell_size=s, block_size=blk, top_k=K, recent_cells=2, retained_cells=3)
    out = long_range_attention(q, k, v, *fs_pair(**kw), rms_weight=weight)
    cells = select_cells(q, k, *fs_pair(**kw))
    want = dense_readout(q, k, v, cells, s=s, weight=weight)
    assert out.dtype == F64 and rel_rms(out, want) < 1e-12
    grad = randn(*out.shape, seed=9)
    leaves = [t for t in (q, k, v, weight) if t is not None]
    got_g = torch.autograd.grad(out, leaves, grad)
    want_g = torch.autograd.grad(want, leaves, grad)
    for name, g, w in zip("qkvw", got_g, want_g):
        assert rel_rms(g, w) < 1e-10, name


def test_cell_readout_gradcheck_with_empty_rows_and_padding(readout_layout):
    s, seq = 4, 22  # 5 complete cells, a 2-token tail
    q, k, v = (randn(1, seq, 2, 3, seed=i).requires_grad_() for i in range(3))
    cells = torch.randint(-1, seq // s, (1, seq, 2, 3), generator=torch.Generator().manual_seed(0))
    cells[:, :5] = -1  # rows with nothing selected
    cells[:, 6, :, 1] = cells[:, 6, :, 0].clamp_min(0)  # a repeated cell
    weight = randn(2, 3, seed=4).requires_grad_()
    assert torch.autograd.gradcheck(lambda *t: cell_readout(*t[:3], cells, fs_config(cell_size=s), rms_weight=t[3]),
                                    (q, k, v, weight))


def test_readout_reads_a_repeated_cell_twice(readout_layout):
    """Each listed cell is read (select_cells never repeats one): a repeat doubles its softmax weight."""
    q, k, v = (randn(1, 30, 2, 4, seed=i) for i in range(3))
    cells = torch.randint(0, 7, (1, 30, 2, 3), generator=torch.Generator().manual_seed(1))
    cells[..., 2] = cells[..., 0]
    logits = torch.einsum("bihd,bjhd->bhij", q, k) / 2.0
    tok = torch.arange(30) // 4
    weight = (cells[..., None] == torch.where(tok < 7, tok, -2)).sum(-2).transpose(1, 2)  # Bt H N N
    probs = weight * torch.exp(logits - logits.amax(-1, keepdim=True))
    y = torch.einsum("bhij,bjhd->bihd", probs / probs.sum(-1, keepdim=True), v)
    want = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-8)
    torch.testing.assert_close(cell_readout(q, k, v, cells, fs_config(cell_size=4)), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("variant", ["fs", "fsl"])
def test_first_block_is_zero_with_finite_grads(variant):
    q, k, v = (randn(1, 70, 2, 8, seed=i, dtype=torch.float32).requires_grad_() for i in range(3))
    out = long_range_attention(q, k, v,
                               fs_config(variant, cell_size=4, block_size=16, top_k=2, recent_cells=1,
                                         retained_cells=2), fs_prior())
    assert torch.equal(out[:, :16], torch.zeros_like(out[:, :16]))
    assert (out[:, 16:].abs().sum(-1) > 0).all()
    out.pow(2).sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(q.grad[:, :16], torch.zeros_like(q.grad[:, :16]))


@pytest.mark.parametrize("variant", ["fs", "fsl"])
def test_causality(variant):
    kw = dict(variant=variant, cell_size=4, block_size=8, top_k=2, recent_cells=1, retained_cells=3)
    q, k, v = (randn(2, 90, 2, 8, seed=i) for i in range(3))
    t = 45
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, t:] = randn(2, 90 - t, 2, 8, seed=11)
    assert torch.equal(select_cells(q, k, *fs_pair(**kw))[:, :t], select_cells(q2, k2, *fs_pair(**kw))[:, :t])
    torch.testing.assert_close(long_range_attention(q, k, v, *fs_pair(**kw))[:, :t],
                               long_range_attention(q2, k2, v2, *fs_pair(**kw))[:, :t], rtol=0, atol=1e-12)


@pytest.mark.parametrize("variant", ["fs", "fsl"])
def test_translation_by_multiple_of_block(variant):
    """Prepend m*B tokens whose keys are zero: their cells score exactly 0 (kbar = 0, a = 0) and have the
    lowest priority, while every real cell scores > 0. Tokens, cells, blocks and boundaries all move by
    m*B; the selection shifts by m*B/s and the readout is unchanged wherever the unshifted sequence
    has K cells to choose from."""
    s, blk, K, m, seq, dim = 4, 16, 3, 2, 150, 8
    kw = dict(variant=variant, cell_size=s, block_size=blk, top_k=K, recent_cells=2, retained_cells=4, lam=1.5)
    q, k, v = randn(1, seq, 2, dim, seed=1), randn(1, seq, 2, dim, seed=2), randn(1, seq, 2, dim, seed=3)
    q[..., 0], k[..., 0] = 5 + q[..., 0].abs(), 5 + k[..., 0].abs()  # content terms > 0
    pad = m * blk
    qy = torch.cat((randn(1, pad, 2, dim, seed=4), q), 1)
    ky = torch.cat((torch.zeros(1, pad, 2, dim, dtype=F64), k), 1)
    vy = torch.cat((randn(1, pad, 2, dim, seed=5), v), 1)
    sel_x, sel_y = select_cells(q, k, *fs_pair(**kw)), select_cells(qy, ky, *fs_pair(**kw))[:, pad:]
    real = sel_x >= 0
    assert torch.equal(sel_y[real], sel_x[real] + pad // s)
    assert (sel_y[~real] < pad // s).all()  # where x had no cell, y may only read padding
    full = real.all(-1)  # rows of x with K selected cells
    assert full.sum() > 0.5 * full.numel()
    out_x = long_range_attention(q, k, v, *fs_pair(**kw))
    out_y = long_range_attention(qy, ky, vy, *fs_pair(**kw))[:, pad:]
    torch.testing.assert_close(out_y[full], out_x[full], rtol=0, atol=1e-12)


def test_fsl_equals_fs_when_retention_covers_the_prefix():
    kw = dict(cell_size=4, block_size=8, top_k=3, recent_cells=2)
    q, k = randn(2, 200, 3, 6, seed=1), randn(2, 200, 3, 6, seed=2)
    fs = select_cells(q, k, *fs_pair(variant="fs", **kw))
    assert torch.equal(select_cells(q, k, *fs_pair(variant="fsl", retained_cells=48, **kw)), fs)  # max |C_i| = 48
    fsl = select_cells(q, k, *fs_pair(variant="fsl", retained_cells=20, **kw))
    covered = torch.arange(200) // 8 * 8 // 4 <= 20  # queries with |C_i| <= P
    assert torch.equal(fsl[:, covered], fs[:, covered])
    assert not torch.equal(fsl[:, ~covered], fs[:, ~covered])


def test_fsl_with_p_plus_w_covering_the_prefix_can_differ_from_fs():
    """|C_i| = 4, P = W = 2: the top-P cells by norm are the two recent ones, so the available set is
    {2, 3}, not C_i = {0, 1, 2, 3}, even though P + W >= |C_i|."""
    s, dim = 4, 4
    q = torch.zeros(1, 32, 1, dim, dtype=F64)
    q[..., 0] = 1.0
    k = torch.zeros(1, 32, 1, dim, dtype=F64)
    k[:, :8, :, 0] = 0.5  # cells 0, 1: aligned with q, small norm
    k[:, 8:16, :, 1] = 10.0  # cells 2, 3: orthogonal to q, large norm
    kw = dict(cell_size=s, block_size=16, top_k=2, lam=0.0, recent_cells=2, retained_cells=2)
    assert select_cells(q, k, *fs_pair(variant="fs", **kw))[0, 16:, 0].tolist() == [[0, 1]] * 16
    assert select_cells(q, k, *fs_pair(variant="fsl", **kw))[0, 16:, 0].tolist() == [[2, 3]] * 16


@pytest.mark.parametrize("variant", ["fs", "fsl"])
def test_constant_gate_bound(variant):
    """Replacing g_h by 1 (sigma -> 0) changes the top-K set only where the K-th/(K+1)-th gap of the
    constant-gate scores is at most max_c lam a_c erfc((i - p_c) / (2 sigma))."""
    s, blk, K, sigma, lam = 4, 8, 2, 6.0, 2.0
    kw = dict(variant=variant, cell_size=s, block_size=blk, top_k=K, recent_cells=2, retained_cells=4, lam=lam)
    q, k = randn(1, 160, 2, 6, seed=3), randn(1, 160, 2, 6, seed=4)
    with_g = select_cells(q, k, *fs_pair(sigma=sigma, **kw))
    const = select_cells(q, k, *fs_pair(sigma=1e-30, **kw))  # erf(huge) == 1 exactly
    scores, avail, a, p = dense_scores(q, k, variant=variant, s=s, blk=blk, sigma=sigma, lam=lam, W=2, P=4,
                                       gate_one=True)
    assert torch.equal(const, dense_select(q, k, variant=variant, s=s, blk=blk, K=K, sigma=1e-30, lam=lam,
                                           W=2, P=4))
    erfc = torch.erfc((torch.arange(160, dtype=F64)[:, None] - p) / (2 * sigma))  # N C
    delta = (lam * a.transpose(1, 2)[:, None] * erfc[None, :, None, :]).masked_fill(~avail, 0).amax(-1)
    top = scores.masked_fill(~avail, float("-inf")).topk(K + 1, dim=-1).values
    gap = top[..., K - 1] - top[..., K]
    changed = (with_g.sort(-1).values != const.sort(-1).values).any(-1)
    assert changed.sum() >= 5  # the bound is exercised, not vacuous
    assert (gap[changed] <= delta[changed] + 1e-12).all()


def test_ties_go_to_the_earlier_cell():
    """Identical cells with exactly representable scores: selection is the earliest cells, in order."""
    q = torch.zeros(1, 24, 1, 4)
    q[..., 0] = 1.0
    k = torch.zeros(1, 24, 1, 4)
    k[..., 0] = 1.0
    kw = dict(cell_size=2, block_size=4, top_k=3)
    for lam, sigma in ((0.0, 4.0), (1.0, 1e-30)):  # no prior / a constant prior: every score ties
        fs = select_cells(q, k, *fs_pair(variant="fs", lam=lam, sigma=sigma, **kw))
        assert fs[0, 8, 0].tolist() == [0, 1, 2] and fs[0, 4, 0].tolist() == [0, 1, -1]
        fsl = select_cells(q, k, *fs_pair(variant="fsl", lam=lam, sigma=sigma, recent_cells=2, retained_cells=2, **kw))
        assert fsl[0, 16, 0].tolist() == [0, 1, 6]  # top-P ties -> cells 0, 1; recent 6, 7
    q2 = torch.zeros(1, 12, 1, 4)
    q2[..., 0] = 1.0
    k2 = torch.zeros(1, 12, 1, 4)
    k2[:, 2:4, :, 0] = 2.0  # cell 1 and cell 3 tie on top, cell 2 below
    k2[:, 6:8, :, 0] = 2.0
    k2[:, 4:6, :, 0] = 1.0
    chosen = select_cells(q2, k2, fs_config("fs", cell_size=2, block_size=8, top_k=2), fs_prior(lam=0.0))
    assert chosen[0, 8, 0].tolist() == [1, 3]


def test_low_precision_routing_and_readout():
    q, k, v = (randn(1, 100, 2, 8, seed=i, dtype=torch.bfloat16) for i in range(3))
    kw = dict(variant="fsl", cell_size=4, block_size=8, top_k=2, recent_cells=1, retained_cells=3)
    assert torch.equal(select_cells(q, k, *fs_pair(**kw)), select_cells(q.float(), k.float(), *fs_pair(**kw)))
    out = long_range_attention(q, k, v, *fs_pair(**kw))
    assert out.dtype == torch.bfloat16
    ref = long_range_attention(q.float(), k.float(), v.float(), *fs_pair(**kw))
    assert rel_rms(out.float(), ref) < 1e-2


@pytest.mark.parametrize("variant", ["fs", "fsl"])
def test_no_quadratic_tensor(variant):
    seq, s = 2048, 4
    q, k, v = (randn(1, seq, 1, 4, seed=i, dtype=torch.float32).requires_grad_() for i in range(3))
    with WorkCounter() as mode:
        long_range_attention(q, k, v,
                             fs_config(variant, cell_size=s, block_size=16, top_k=2, recent_cells=2,
                                       retained_cells=4), fs_prior()).sum().backward()
    assert mode.largest < seq * seq // s // 4  # far below N x N / s


@pytest.mark.parametrize("call,match", [
    (lambda q, k, v: select_cells(q, k[:, :-1], fs_config(), fs_prior()), "share"),
    (lambda q, k, v: select_cells(q[0], k[0], fs_config(), fs_prior()), "share"),
    (lambda q, k, v: select_cells(q, k, fs_config(cell_size=4, block_size=10), fs_prior()), "block_size"),
    (lambda q, k, v: select_cells(q, k, fs_config(cell_size=0), fs_prior()), "cell_size"),
    (lambda q, k, v: select_cells(q, k, fs_config(top_k=0), fs_prior()), "top_k"),
    (lambda q, k, v: select_cells(q, k, fs_config("fsx"), fs_prior()), "variant"),
    (lambda q, k, v: select_cells(q, k, fs_config(recent_cells=-1), fs_prior()), "recent_cells"),
    (lambda q, k, v: select_cells(q, k, fs_config(), fs_prior(sigma=0.0)), "sigma"),
    (lambda q, k, v: select_cells(q, k, fs_config(), fs_prior(lam=-1.0)), "lam"),
    (lambda q, k, v: select_cells(q, k, fs_config(), fs_prior(sigma=torch.ones(3))), "sigma"),
    (lambda q, k, v: select_cells(q, k, fs_config(impl="cuda"), fs_prior()), "impl"),
    (lambda q, k, v: long_range_attention(q, k, v[..., :-1], fs_config(), fs_prior()), "share"),
    (lambda q, k, v: long_range_attention(q, k, v, fs_config(), fs_prior(), rms_weight=torch.ones(3, 8)), "rms_weight"),
    (lambda q, k, v: cell_readout(q, k, v, torch.zeros(1, 40, 2, dtype=torch.long), fs_config()), "cells"),
    (lambda q, k, v: cell_readout(q, k, v, torch.zeros(1, 40, 2, 1), fs_config()), "integer"),
    (lambda q, k, v: cell_readout(q, k, v, torch.full((1, 40, 2, 1), 10), fs_config(cell_size=4)), r"\[-1, 9\]"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_bad_inputs_raise_value_error(call, match):
    q, k, v = (randn(1, 40, 2, 8, seed=i) for i in range(3))
    with pytest.raises(ValueError, match=match):
        call(q, k, v)


def test_dispatch_to_kernels(monkeypatch):
    q, k, v = (randn(1, 40, 2, 8, seed=i).float() for i in range(3))  # a dtype the kernels take
    monkeypatch.setitem(sys.modules, "fsf_kernels.cell_routing", None)  # import fails
    with pytest.raises(RuntimeError, match="triton"):
        select_cells(q, k, fs_config(impl="triton"), fs_prior())
    calls = {}
    routing = types.ModuleType("fsf_kernels.cell_routing")
    none = torch.full((1, 40, 2, 2), -1)
    routing.select_cells = lambda q, k, *args, **kw: calls.setdefault("route", (args, kw, none))[-1]
    readout = types.ModuleType("fsf_kernels.cell_readout")
    readout.cell_readout = lambda q, k, v, cells, *args, **kw: calls.setdefault("read", (args, kw, q))[-1]
    monkeypatch.setitem(sys.modules, "fsf_kernels.cell_routing", routing)
    monkeypatch.setitem(sys.modules, "fsf_kernels.cell_readout", readout)
    config, prior = fs_config(impl="triton", cell_size=4, block_size=8, top_k=2), fs_prior()
    long_range_attention(q, k, v, config, prior, eps=1e-6)
    assert calls["route"][:2] == ((config, prior), {"q_start": 0})  # the settings and prior, whole
    assert calls["read"][:2] == ((config,), {"rms_weight": None, "eps": 1e-6, "q_start": 0})


@pytest.mark.parametrize("variant", ["fs", "fsl"])
def test_routing_from_slice_summaries_equals_routing_from_the_keys(variant):
    """`summarize_cells` of each slice, concatenated, then `select_cells_from_summaries` for a later
    slice's queries selects exactly `select_cells`' cells for them (what a sequence-parallel rank does:
    a cell's summaries read only its own keys); a summary count that is not the prefix's is refused."""
    from fsframework.ops.freesolo import select_cells_from_summaries, summarize_cells

    gen = torch.Generator().manual_seed(4)
    q, k = (torch.randn(2, 150, 2, 8, generator=gen) for _ in range(2))
    settings = dict(variant=variant, cell_size=4, block_size=16, top_k=3, retained_cells=3, recent_cells=2)
    prior = dict(sigma=torch.tensor([1.5, 6.0]), lam=0.9)
    whole = select_cells(q, k, *fs_pair(impl="reference", **settings, **prior))
    slices = [(0, 48), (48, 112), (112, 150)]
    pieces = [summarize_cells(k[:, lo:hi], fs_pair(impl="reference", **settings)[0]) for lo, hi in slices]
    kbar, a = (torch.cat([p[i] for p in pieces], dim=2) for i in range(2))
    assert kbar.shape == (2, 2, 37, 8) and a.shape == (2, 2, 37)
    for lo, hi in slices[1:]:
        got = select_cells_from_summaries(q[:, lo:hi], kbar[:, :, :hi // 4], a[:, :, :hi // 4],
                                          *fs_pair(impl="reference", **settings, **prior), q_start=lo)
        assert torch.equal(got, whole[:, lo:hi]), (lo, hi)
    with pytest.raises(ValueError, match="summaries of the 28 complete cells"):
        select_cells_from_summaries(q[:, 48:112], kbar, a, *fs_pair(impl="reference", **settings, **prior), q_start=48)
    with pytest.raises(ValueError, match="multiple of block_size"):
        select_cells_from_summaries(q[:, 40:112], kbar[:, :, :28], a[:, :, :28],
                                    *fs_pair(impl="reference", **settings, **prior), q_start=40)
    with pytest.raises(ValueError, match="'fs' and 'fsl'"):
        select_cells_from_summaries(q, kbar, a, fs_config("fsb"), fs_prior())
