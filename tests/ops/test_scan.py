"""The tree scan against an independent definition (docs/argrc.md §2), with a combine that
is not associative, so any deviation from the tree shows."""

from __future__ import annotations

import pytest
import torch

from fsframework.ops.scan import exclusive_scan, row_tiled

D = 3


def skew(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Not associative, not commutative, nonlinear."""
    return torch.tanh(0.7 * a - 1.3 * b + 0.25 * a * b) + 0.1 * b.roll(1, dims=-1)


def balanced(block: list[torch.Tensor]) -> torch.Tensor:
    if len(block) == 1:
        return block[0]
    half = len(block) // 2
    return skew(balanced(block[:half])[None], balanced(block[half:])[None])[0]


def dyadic_prefix(x: torch.Tensor, t: int, e: torch.Tensor) -> torch.Tensor:
    """op(...op(op(e, S_1), S_2)..., S_m) over the dyadic blocks of t, largest first."""
    value, start = e, 0
    for bit in reversed(range(t.bit_length())):
        if t >> bit & 1:
            size = 1 << bit
            value = skew(value[None], balanced(list(x[start:start + size]))[None])[0]
            start += size
    return value


@pytest.mark.parametrize("n", [1, 2, 5, 8, 13, 16])
def test_matches_the_dyadic_fold(n):
    torch.manual_seed(n)
    x, e = torch.randn(2, n, D, dtype=torch.float64), torch.randn(D, dtype=torch.float64)
    got = exclusive_scan(x, skew, e)
    for b in range(2):
        want = torch.stack([dyadic_prefix(x[b], t, e) for t in range(n)])
        torch.testing.assert_close(got[b], want, rtol=1e-12, atol=1e-12)


def test_rows_do_not_depend_on_the_length_or_what_follows():
    torch.manual_seed(1)
    x, e = torch.randn(2, 23, D, dtype=torch.float64), torch.randn(D, dtype=torch.float64)
    full = exclusive_scan(x, skew, e)
    for n in (1, 6, 11, 16, 17):
        torch.testing.assert_close(exclusive_scan(x[:, :n], skew, e), full[:, :n], rtol=0, atol=0)
    padded = torch.cat((x[:, :9], torch.full((2, 7, D), 5.0, dtype=torch.float64)), dim=1)
    torch.testing.assert_close(exclusive_scan(padded, skew, e)[:, :10], full[:, :10], rtol=0, atol=0)


@pytest.mark.parametrize("n, levels", [(1, 0), (2, 1), (7, 3), (8, 3), (9, 4), (1000, 10)])
def test_one_combine_call_per_level(n, levels):
    calls = []

    def counting(a, b):
        calls.append(a.shape[0])
        return skew(a, b)

    exclusive_scan(torch.randn(3, n, D), counting, torch.zeros(D))
    assert len(calls) <= 2 * levels
    assert sum(calls) <= 3 * 2 * n  # O(N) rows in all, batch of 3


def test_a_per_sequence_identity_and_gradients():
    torch.manual_seed(2)
    x = torch.randn(2, 6, D, dtype=torch.float64, requires_grad=True)
    e = torch.randn(2, D, dtype=torch.float64, requires_grad=True)
    got = exclusive_scan(x, skew, e)
    for b in range(2):
        torch.testing.assert_close(got[b, 5], dyadic_prefix(x[b].detach(), 5, e[b].detach()))
    assert torch.autograd.gradcheck(lambda x, e: exclusive_scan(x, skew, e), (x, e))


def test_bad_input_names_the_problem():
    x = torch.randn(2, 4, D)
    with pytest.raises(ValueError, match="identity must be"):
        exclusive_scan(x, skew, torch.zeros(D + 1))
    with pytest.raises(ValueError, match="combine must map"):
        exclusive_scan(x, lambda a, b: torch.cat((a, b), dim=-1), torch.zeros(D))
    with pytest.raises(ValueError, match="x must be"):
        exclusive_scan(torch.randn(4, D), skew, torch.zeros(D))


@pytest.mark.parametrize("rows", [1, 3, 4, 64])
def test_row_tiles_give_the_same_rows_in_tiles_no_larger_than_asked(rows):
    torch.manual_seed(3)
    seen = []

    def recording(a, b):
        seen.append(a.shape[0])
        return skew(a, b)

    a, b = torch.randn(10, D, dtype=torch.float64), torch.randn(10, D, dtype=torch.float64)
    torch.testing.assert_close(row_tiled(recording, rows)(a, b), skew(a, b), rtol=0, atol=0)
    assert max(seen) == min(rows, 10) and sum(seen) == 10
    x, e = torch.randn(2, 21, D, dtype=torch.float64), torch.randn(D, dtype=torch.float64)
    torch.testing.assert_close(exclusive_scan(x, row_tiled(skew, rows), e), exclusive_scan(x, skew, e),
                               rtol=0, atol=0)
    with pytest.raises(ValueError, match="combine must map"):  # a wrong width still gets the scan's error
        exclusive_scan(x, row_tiled(lambda a, b: torch.cat((a, b), dim=-1), rows), e)
    with pytest.raises(ValueError, match="rows per tile"):
        row_tiled(skew, 0)
