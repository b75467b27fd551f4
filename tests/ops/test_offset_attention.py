"""Attention of queries at an offset (`fsframework.ops.offset_attention`) against the dense
definitions, in fp64: `causal_attention_at` forward and every gradient, on each of the CPU calls
its shape picks (docs/architecture.md, "One computation per attention kind": one query without
a mask, few queries with an explicit mask, in pieces without autograd, many queries front-padded)
and with an additive bias;
`window_attention_at` for one query, a query block and a long slice against the rows of the
whole-sequence sliding-window attention."""

from __future__ import annotations

import math

import pytest
import torch

from fsframework.ops.local_attention import sliding_window_attention
from fsframework.ops.offset_attention import causal_attention_at, mask_queries, window_attention_at


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


# (n, start): padded (start < n), explicit mask (start >= n), one query (no mask)
SHAPES = [(9, 0), (9, 1), (9, 7), (9, 16), (1, 0), (1, 5), (3, 40)]


@pytest.mark.parametrize("n, start", SHAPES, ids=str)
@pytest.mark.parametrize("with_bias", [False, True], ids=["plain", "bias"])
def test_matches_the_dense_definition(n, start, with_bias):
    gen = torch.Generator().manual_seed(start)
    heads, dim = 2, 4
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


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_a_long_slice_after_many_keys_matches_in_either_mode(grad):
    """More queries than one mask call takes (`mask_queries`): in pieces without autograd,
    front-padded with it; the same numbers either way."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 40, 1, 4, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, 100, 1, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    assert mask_queries(q) < 40
    with torch.set_grad_enabled(grad):
        got = causal_attention_at(q.requires_grad_(grad), k, v, 60)
    torch.testing.assert_close(got, dense(q, k, v, 60), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n, start", [(1, 30), (1, 5), (8, 24), (16, 16), (20, 40), (3, 0)], ids=str)
@pytest.mark.parametrize("rope_theta", [10000.0, None], ids=["rope", "nope"])
def test_window_attention_at_equals_rows_of_the_whole_sequence(n, start, rope_theta):
    """One query and a query block (computed directly), a slice longer than the window (padded)."""
    window = 12
    gen = torch.Generator().manual_seed(n + start)
    q, k, v = (torch.randn(2, start + n, 2, 4, generator=gen, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    want = sliding_window_attention(q, k, v, window=window, rope_theta=rope_theta, impl="reference")[:, start:]
    low = max(0, start - window - 3)  # a few keys more than the window: dropped
    got = window_attention_at(q[:, start:], k[:, low:], v[:, low:], start, window=window, rope_theta=rope_theta,
                              impl="reference")
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    grad = torch.randn(got.shape, generator=gen, dtype=torch.float64)
    for g, w in zip(torch.autograd.grad(got, (q, k, v), grad), torch.autograd.grad(want, (q, k, v), grad)):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
