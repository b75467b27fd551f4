"""Sliding-window attention (fsframework/ops/local_attention.py), the reference and the fused form that
`impl="auto"` runs on the CPU, against the definition, a dense softmax with the band `0 <= i - j <= window`
as an additive mask: outputs and gradients, across the chunking (several chunks, a ragged last one, a
window wider than the chunk, one chunk for the whole sequence). Packed documents (`positions`): one call
equals each document run alone as a row of its own, fp64, outputs and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from fsframework.ops.local_attention import (sliding_window_attention, window_attention_reference,
                                             window_attention_sdpa)
from fsframework.ops.rope import rotate
from tests.utils import positions_of


def _definition(q, k, v, window: int) -> torch.Tensor:
    seq = q.shape[1]
    i, j = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
    bias = torch.zeros(seq, seq, dtype=q.dtype).masked_fill(~((i - j >= 0) & (i - j <= window)), float("-inf"))
    logits = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(q.shape[-1]) + bias
    return torch.einsum("bhij,bjhd->bihd", logits.softmax(-1), v)


FORMS = {"reference": window_attention_reference, "sdpa": window_attention_sdpa}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("seq,window,chunk", [(100, 8, 16), (77, 20, 16), (64, 63, 32), (30, 4, 128), (50, 0, 8)])
def test_matches_the_banded_softmax(form, seq, window, chunk):
    gen = torch.Generator().manual_seed(seq + window)
    q, k, v = (torch.randn(2, seq, 3, 8, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    grad = torch.randn(2, seq, 3, 8, dtype=torch.float64, generator=gen)
    got = FORMS[form](q, k, v, window=window, chunk=chunk)
    want = _definition(q, k, v, window)
    torch.testing.assert_close(got, want)
    for x, g_got, g_want in zip((q, k, v), torch.autograd.grad(got, (q, k, v), grad),
                                torch.autograd.grad(want, (q, k, v), grad)):
        torch.testing.assert_close(g_got, g_want)


@pytest.mark.parametrize("form", FORMS)
def test_keeps_the_input_dtype_and_computes_in_fp32(form):
    q, k, v = (torch.randn(1, 40, 2, 16, dtype=torch.bfloat16) for _ in range(3))
    got = FORMS[form](q, k, v, window=8, chunk=16)
    assert got.dtype == torch.bfloat16
    want = _definition(q.float(), k.float(), v.float(), 8)
    torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=1e-2)


def test_auto_runs_the_fused_form_on_the_cpu_and_reference_the_reference(monkeypatch):
    import fsframework.ops.local_attention as local

    ran = []
    for name in FORMS.values():
        monkeypatch.setattr(local, name.__name__, lambda *a, _name=name.__name__, **kw: ran.append(_name))
    q = torch.randn(1, 12, 2, 8)
    for impl in ("auto", "reference"):
        sliding_window_attention(q, q, q, window=4, impl=impl)
    assert ran == ["window_attention_sdpa", "window_attention_reference"]


# --- packed documents (positions) ---


def _per_document(fn, rows: list[list[int]], *tensors: torch.Tensor) -> torch.Tensor:
    """`fn` on each document alone (a batch of one row), the outputs put back in the packed layout."""
    out = []
    for b, lengths in enumerate(rows):
        starts = [sum(lengths[:i]) for i in range(len(lengths))]
        out.append(torch.cat([fn(*(x[b:b + 1, s:s + n] for x in tensors)) for s, n in zip(starts, lengths)], dim=1))
    return torch.cat(out)


def _grads(out, inputs, grad):
    return torch.autograd.grad(out, inputs, grad)


def _assert_exact(got, want):
    """fp64: the packed call and the documents alone differ only in the order of their sums."""
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


# (rows' document lengths, window, chunk): boundaries inside a chunk, documents longer than the window
# and a window longer than documents, 1-token documents, rows of different documents in one batch
DOCUMENTS = [
    ([[7, 33, 1, 19], [60]], 8, 16),
    ([[25, 3, 1, 1, 20], [1, 49]], 20, 16),
    ([[13, 17, 10], [40]], 64, 8),
    ([[1] * 12 + [18]], 0, 8),
]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("rows,window,chunk", DOCUMENTS)
def test_documents_in_one_call_equal_each_document_alone(form, rows, window, chunk):
    seq = sum(rows[0])
    gen = torch.Generator().manual_seed(seq + window)
    q, k, v = (torch.randn(len(rows), seq, 2, 8, dtype=torch.float64, generator=gen, requires_grad=True)
               for _ in range(3))
    grad = torch.randn(len(rows), seq, 2, 8, dtype=torch.float64, generator=gen)
    got = FORMS[form](q, k, v, window=window, chunk=chunk, positions=positions_of(rows))
    want = _per_document(lambda *x: FORMS[form](*x, window=window, chunk=chunk), rows, q, k, v)
    _assert_exact(got, want)
    for g_got, g_want in zip(_grads(got, (q, k, v), grad), _grads(want, (q, k, v), grad)):
        _assert_exact(g_got, g_want)


@pytest.mark.parametrize("impl", ["reference", "auto"])
@pytest.mark.parametrize("theta", [10000.0, None])
def test_the_op_rotates_each_document_from_its_start(impl, theta):
    """Through `sliding_window_attention`: RoPE at the positions inside each document (`rotate_at`)."""
    rows = [[9, 1, 30], [22, 18]]
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 40, 2, 16, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    grad = torch.randn(2, 40, 2, 16, dtype=torch.float64, generator=gen)
    got = sliding_window_attention(q, k, v, window=12, rope_theta=theta, impl=impl, positions=positions_of(rows))
    want = _per_document(lambda *x: sliding_window_attention(*x, window=12, rope_theta=theta, impl=impl), rows,
                         q, k, v)
    _assert_exact(got, want)
    for g_got, g_want in zip(_grads(got, (q, k, v), grad), _grads(want, (q, k, v), grad)):
        _assert_exact(g_got, g_want)


def test_one_document_per_row_is_the_call_withoutpositions_of():
    q, k, v = (torch.randn(2, 50, 2, 8, dtype=torch.float64) for _ in range(3))
    got = sliding_window_attention(q, k, v, window=10, impl="reference", positions=positions_of([[50], [50]]))
    assert torch.equal(got, sliding_window_attention(q, k, v, window=10, impl="reference"))
    # and without positions the op is what it was: the rotation at 0.., then the form
    want = window_attention_reference(rotate(q, 10000.0), rotate(k, 10000.0), v, window=10)
    assert torch.equal(sliding_window_attention(q, k, v, window=10, impl="reference"), want)


@pytest.mark.parametrize("positions, kwargs, match", [
    ([[0, 1, 2, 0, 1, 3]], {}, r"positions\[0, 5\] = 3"),
    ([[1, 2, 3, 4, 5, 6]], {}, "first token"),
    ([[0, 1, 2, 3, 4]], {}, "shape"),
    ([[0.0, 1, 2, 3, 4, 5]], {}, "integer"),
    ([[0, 1, 2, 0, 1, 2]], dict(start_pos=4), "start_pos"),
], ids=["jump", "row-starts-inside", "shape", "float", "start-pos"])
def test_bad_positions_are_refused(positions, kwargs, match):
    x = torch.randn(1, 6, 2, 8)
    with pytest.raises(ValueError, match=match):
        sliding_window_attention(x, x, x, window=2, positions=torch.tensor(positions), **kwargs)
