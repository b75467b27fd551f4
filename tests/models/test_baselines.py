"""Baseline models (TF++, SWA, ALiBi, sinusoidal): forward/backward, causality, attention rules."""

from __future__ import annotations

import math

import pytest
import torch

from fsframework.config import load_config
from fsframework.models.registry import build_model, count_parameters
from tests.utils import assert_future_tokens_do_not_change_past
from fsframework.models.losses import lm_losses

BASELINES = ["tfpp", "swa", "alibi", "sinusoidal"]


def tiny(name: str, **extra):
    overrides = [f"model.name={name}", "model.d_model=32", "model.n_layers=2", "model.n_heads=2",
                 "model.attention.window=8", *(f"{k}={v}" for k, v in extra.items())]
    return load_config(None, overrides).model


@pytest.mark.parametrize("name", BASELINES)
def test_forward_backward_all_params_get_gradients(name):
    torch.manual_seed(0)
    model = build_model(tiny(name))
    tokens = torch.randint(0, 256, (2, 37))
    loss = lm_losses(model(tokens[:, :-1]), tokens[:, 1:])[0]
    assert math.isfinite(loss.item())
    assert abs(loss.item() - math.log(260)) < 0.5, "a fresh model predicts close to uniform"
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, f"{pname} got a zero gradient"


@pytest.mark.parametrize("name", BASELINES)
def test_future_tokens_never_change_earlier_logits(name):
    torch.manual_seed(0)
    assert_future_tokens_do_not_change_past(build_model(tiny(name)).double())


def _dense_reference(q, k, v, bias):
    logits = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(q.shape[-1]) + bias
    return torch.einsum("bhij,bjhd->bihd", logits.softmax(-1), v)


def test_swa_attends_exactly_to_the_window():
    from fsframework.models.attention import SlidingWindowAttention
    from fsframework.ops.rope import rotate

    cfg = tiny("swa")
    attn = SlidingWindowAttention(cfg, 0).double()
    q, k, v = (torch.randn(2, 40, 2, 16, dtype=torch.float64) for _ in range(3))
    i, j = torch.arange(40)[:, None], torch.arange(40)[None, :]
    bias = torch.zeros(40, 40, dtype=torch.float64).masked_fill(~((i - j >= 0) & (i - j <= 8)), float("-inf"))
    torch.testing.assert_close(attn.attend(q, k, v, 0), _dense_reference(rotate(q), rotate(k), v, bias))


def test_alibi_bias_and_chunking():
    from fsframework.models.attention import AlibiAttention
    from fsframework.models.blocks import alibi_slopes

    cfg = tiny("alibi")
    attn = AlibiAttention(cfg, 0).double()
    attn.chunk = 16  # force several query chunks
    q, k, v = (torch.randn(1, 45, 2, 16, dtype=torch.float64) for _ in range(3))
    i, j = torch.arange(45)[:, None], torch.arange(45)[None, :]
    slopes = alibi_slopes(2).double()
    bias = (-slopes[:, None, None] * (i - j)).masked_fill(j > i, float("-inf"))
    torch.testing.assert_close(attn.attend(q, k, v, 0), _dense_reference(q, k, v, bias))
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))


def test_paper_recipe_sizes():
    from tests.utils import REPO

    counts = {}
    for recipe in ("tfpp-340m", "tfpp-800m"):
        cfg = load_config(REPO / "yamls" / f"{recipe}.yaml")
        with torch.device("meta"):
            counts[recipe] = count_parameters(build_model(cfg.model))
    assert 300e6 < counts["tfpp-340m"] < 380e6
    assert 700e6 < counts["tfpp-800m"] < 850e6
