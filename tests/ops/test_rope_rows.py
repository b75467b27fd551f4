"""RoPE tables served from one cached table per (head dim, base, dtype, device)
(`fsf_kernels.common.rope_tables.rope_rows`): the rows built fresh, bit for bit, wherever the
table grows; usable by training after an evaluation built them; and built once, not per call."""

from __future__ import annotations

import pytest
import torch

from fsf_kernels.common import rope_tables
from fsf_kernels.common.rope_tables import rope_cos_sin, rope_rotation_rows, rope_rows
from fsframework.ops.rope import apply_rope, rotate
from tests.work import WorkCounter


@pytest.fixture(autouse=True)
def empty_cache():
    rope_tables._TABLES.clear()
    yield
    rope_tables._TABLES.clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_equal_fresh_tables_across_growth(dtype):
    first = rope_tables._FIRST_CAPACITY
    # inside the first table, its last row, past it (the table doubles), far past it, empty
    for start, length, theta in ((0, 7, 1e4), (100, 50, 1e4), (first - 1, 1, 1e4), (first - 3, 9, 1e4),
                                 (5 * first + 11, 33, 1e4), (0, 0, 1e4), (17, 40, 5e5), (-6, 10, 1e4)):
        cos, sin = rope_rows(start, length, 64, theta, dtype, "cpu")
        want_cos, want_sin = rope_cos_sin(torch.arange(start, start + length), 64, theta, dtype)
        assert cos.dtype == sin.dtype == dtype and cos.is_contiguous() and sin.is_contiguous()
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin), (start, length, theta)
    assert rope_tables._TABLES[("half", 64, 1e4, dtype, torch.device("cpu"))][0].shape[0] >= 5 * first + 44


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_rotate_equals_the_four_products_bit_for_bit(dtype):
    """`rotate`'s one multiply-add over (cos, cos) and (-sin, sin) is `apply_rope`'s arithmetic exactly."""
    gen = torch.Generator().manual_seed(0)
    first = rope_tables._FIRST_CAPACITY
    for start, length in ((0, 37), (first - 5, 11), (3 * first, 2), (-4, 9)):
        x = (torch.randn(2, length, 3, 32, generator=gen) * 3).to(dtype)
        want = apply_rope(x, *rope_cos_sin(torch.arange(start, start + length), 32, 1e4,
                                           torch.promote_types(dtype, torch.float32)))
        got = rotate(x, 1e4, start)
        assert got.dtype == dtype and torch.equal(got, want), (dtype, start, length)
        # gradients too, where x has another use whose gradient meets the rotation's (as FreeSolo's q)
        for form in ("rotate", "apply_rope"):
            leaf = x.detach().requires_grad_()
            y = rotate(leaf, 1e4, start) if form == "rotate" else apply_rope(
                leaf, *rope_cos_sin(torch.arange(start, start + length), 32, 1e4,
                                    torch.promote_types(dtype, torch.float32)))
            (y * 1.7 + leaf.tanh()).float().square().sum().backward()
            grads = grads + [leaf.grad] if form == "apply_rope" else [leaf.grad]
        assert torch.equal(grads[0], grads[1]), (dtype, start, length)
    with pytest.raises(ValueError, match="even head dim"):
        rotate(torch.randn(1, 3, 2, 5))
    cos2, sin2 = rope_rotation_rows(9, 4, 8, 1e4, torch.float32, "cpu")
    cos, sin = rope_cos_sin(torch.arange(9, 13), 8)
    assert cos2.shape == (4, 1, 8) and torch.equal(sin2[:, 0], torch.cat((-sin, sin), -1))
    assert torch.equal(cos2[:, 0], torch.cat((cos, cos), -1))


class _SavesTable(torch.autograd.Function):
    """Saves the table for its backward, as the window kernel saves cos/sin."""

    @staticmethod
    def forward(ctx, x, cos):
        ctx.save_for_backward(cos)
        return x * cos.sum()

    @staticmethod
    def backward(ctx, grad):
        (cos,) = ctx.saved_tensors
        return grad * cos.sum(), None


def test_a_table_built_during_inference_serves_a_later_backward():
    with torch.inference_mode():
        rotate(torch.randn(1, 8, 2, 16))  # an evaluation or a decode builds the table first
    x = torch.randn(3, requires_grad=True)
    cos, _ = rope_rows(0, 8, 16, 1e4, torch.float32, "cpu")
    _SavesTable.apply(x, cos).sum().backward()  # an inference tensor could not be saved
    assert torch.allclose(x.grad, cos.sum().expand(3))


def test_a_rotation_builds_no_table_once_one_covers_its_positions():
    x = torch.randn(1, 1, 2, 32)
    rotate(x, start=3000)
    with WorkCounter() as counted:
        for position in range(3001, 3011):  # ten decoded tokens
            y = rotate(x, start=position)
    table_ops = {"arange", "cos", "sin", "pow", "reciprocal"} & set(counted.ops)
    assert not table_ops, f"the tables were built again: {dict(counted.ops)}"
    want_cos, want_sin = rope_cos_sin(torch.tensor([3010]), 32)
    x1, x2 = x[..., :16], x[..., 16:]
    assert torch.equal(y, torch.cat((x1 * want_cos - x2 * want_sin, x1 * want_sin + x2 * want_cos), dim=-1))
