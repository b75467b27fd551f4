"""Causal attention of queries at an offset (`fsframework.ops.offset_attention.causal_attention_at`)
against the dense definition: forward and every gradient, in fp64, on the CPU path that pads the
queries in front (docs/architecture.md) and with an additive bias."""

from __future__ import annotations

import math

import pytest
import torch

from fsframework.ops.offset_attention import causal_attention_at


def dense(q, k, v, start, bias=None):
    """softmax(q k^T / sqrt(d) + bias, keys j <= start + i) v, written out."""
    n, total, dim = q.shape[1], k.shape[1], q.shape[-1]
    scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(dim)
    if bias is not None:
        scores = scores + bias
    i = torch.arange(start, start + n)[:, None]
    j = torch.arange(total)[None, :]
    scores = scores.masked_fill(j > i, float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v)


@pytest.mark.parametrize("start", [0, 1, 7, 16])
@pytest.mark.parametrize("with_bias", [False, True], ids=["plain", "bias"])
def test_matches_the_dense_definition(start, with_bias):
    gen = torch.Generator().manual_seed(start)
    n, heads, dim = 9, 2, 4
    q = torch.randn(2, n, heads, dim, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, start + n, heads, dim, generator=gen, dtype=torch.float64, requires_grad=True)
            for _ in range(2))
    bias = torch.randn(heads, n, start + n, generator=gen, dtype=torch.float64) if with_bias else None
    got = causal_attention_at(q, k, v, start, bias=bias)
    want = dense(q, k, v, start, bias)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    grad = torch.randn(got.shape, generator=gen, dtype=torch.float64)
    got_grads = torch.autograd.grad(got, (q, k, v), grad)
    want_grads = torch.autograd.grad(want, (q, k, v), grad)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_keys_that_do_not_end_with_the_queries_are_refused():
    q, k = torch.zeros(1, 4, 1, 2), torch.zeros(1, 6, 1, 2)
    with pytest.raises(ValueError, match=r"queries at \[3, 7\) need keys \[0, 7\), got 6"):
        causal_attention_at(q, k, k, 3)
