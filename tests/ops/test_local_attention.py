"""Sliding-window attention (fsframework/ops/local_attention.py), the reference and the fused form that
`impl="auto"` runs on the CPU, against the definition, a dense softmax with the band `0 <= i - j <= window`
as an additive mask: outputs and gradients, across the chunking (several chunks, a ragged last one, a
window wider than the chunk, one chunk for the whole sequence)."""

from __future__ import annotations

import math

import pytest
import torch

from fsframework.ops.local_attention import (sliding_window_attention, window_attention_reference,
                                             window_attention_sdpa)


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
