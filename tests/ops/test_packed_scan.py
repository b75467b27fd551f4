"""The packed tree scan (docs/argrc.md §2, "Packed documents"): many sequences laid end to end
scanned in one tree's worth of combine calls give each sequence's own scan, row for row."""

from __future__ import annotations

import random

import pytest
import torch

from fsf_kernels.common.tree_tables import tree_tables
from fsframework.ops.scan import exclusive_scan, packed_exclusive_scan
from tests.ops.test_scan import D, skew


def _one_by_one(xs: list[torch.Tensor], combine, identity: torch.Tensor) -> torch.Tensor:
    return torch.cat([exclusive_scan(x[None], combine, identity)[0] for x in xs])


def _grads(loss: torch.Tensor, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Gradients, zero for an input nothing read (a sequence's last leaf is read by no exclusive
    prefix: a one-leaf sequence's scan reads no leaf at all)."""
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    return [g if g is not None else torch.zeros_like(x) for g, x in zip(grads, inputs)]


def _lengths(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.choice([1, 2, 3, rng.randint(1, 70)]) for _ in range(rng.randint(1, 12))]


@pytest.mark.parametrize("lengths", [[1], [2], [5], [1, 1, 1], [3, 1, 7], [16, 17, 5, 1, 2, 33], [64, 65, 1]]
                         + [_lengths(seed) for seed in range(6)])
def test_equals_each_sequence_scanned_alone(lengths):
    """Bit for bit with an elementwise combine (the same rows combined in the same order), and the
    gradients of the leaves and the identity too."""
    gen = torch.Generator().manual_seed(sum(lengths))
    xs = [torch.randn(n, D, dtype=torch.float64, generator=gen, requires_grad=True) for n in lengths]
    identity = torch.randn(D, dtype=torch.float64, generator=gen, requires_grad=True)
    want = _one_by_one(xs, skew, identity)
    leaves = torch.cat(xs).detach().requires_grad_()
    got = packed_exclusive_scan(leaves, tree_tables(lengths), skew, identity)
    assert torch.equal(got, want)
    probe = torch.randn(got.shape, dtype=torch.float64, generator=gen)
    want_grads = _grads((want * probe).sum(), [*xs, identity])
    got_grads = _grads((got * probe).sum(), [leaves, identity])
    torch.testing.assert_close(got_grads[0], torch.cat(want_grads[:-1]), rtol=0, atol=1e-12)
    torch.testing.assert_close(got_grads[1], want_grads[-1], rtol=0, atol=1e-12)


class _Counted:
    """A combine that counts its calls and the rows it combines."""

    def __init__(self):
        self.calls, self.rows = 0, 0

    def __call__(self, a, b):
        self.calls += 1
        self.rows += a.shape[0]
        return skew(a, b)


@pytest.mark.parametrize("count", [1, 8, 64])
def test_one_tree_of_calls_however_many_sequences(count):
    """The work guard: `2 * ceil(log2 (max n))` combine calls whatever the number of sequences (one
    sequence's tree), and exactly the rows the sequences scanned one by one combine, no more."""
    rng = random.Random(count)
    longest = 257
    lengths = [longest] + [rng.randint(1, longest) for _ in range(count - 1)]
    xs = [torch.randn(n, D, dtype=torch.float64) for n in lengths]
    identity = torch.zeros(D, dtype=torch.float64)
    packed, alone = _Counted(), _Counted()
    packed_exclusive_scan(torch.cat(xs), tree_tables(lengths), packed, identity)
    _one_by_one(xs, alone, identity)
    assert packed.calls <= 2 * (longest - 1).bit_length()
    assert packed.rows == alone.rows


def test_bad_tables_and_leaves_are_refused():
    with pytest.raises(ValueError, match="at least one leaf"):
        tree_tables([3, 0])
    with pytest.raises(ValueError, match=r"R0 = 5"):
        packed_exclusive_scan(torch.zeros(4, D), tree_tables([2, 3]), skew, torch.zeros(D))
    with pytest.raises(ValueError, match=r"identity must be \[D\]"):
        packed_exclusive_scan(torch.zeros(5, D), tree_tables([2, 3]), skew, torch.zeros(2, D))
