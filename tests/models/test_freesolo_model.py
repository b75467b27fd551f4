"""FreeSolo FS / FS-L models: forward/backward, initialisation, causality and the branch combinations."""

from __future__ import annotations

import math

import pytest
import torch

from fsframework.config import load_config
from fsframework.models.freesolo_attention import FreeSoloAttention
from fsframework.models.freesolo_settings import fs_config, fs_prior
from fsframework.models.registry import build_model
from tests.utils import assert_future_tokens_do_not_change_past
from fsframework.ops.freesolo import long_range_attention
from fsframework.ops.local_attention import sliding_window_attention
from fsframework.models.losses import lm_losses

COMBINES = ["sum", "gate", "separate_wo"]


def tiny(name: str, **extra):
    """d_model 32, 2 layers, 2 heads of 16; s=4, B=8, window 8, K=2, P=3, W=1."""
    overrides = [f"model.name={name}", "model.d_model=32", "model.n_layers=2", "model.n_heads=2",
                 "model.attention.window=8", "model.attention.cell_size=4", "model.attention.block_size=8",
                 "model.attention.top_k=2", "model.attention.retained_cells=3", "model.attention.recent_cells=1",
                 *(f"{k}={v}" for k, v in extra.items())]
    return load_config(None, overrides).model


@pytest.mark.parametrize("combine", COMBINES)
@pytest.mark.parametrize("name", ["fs", "fsl"])
def test_forward_backward_all_params_get_finite_gradients(name, combine):
    torch.manual_seed(0)
    model = build_model(tiny(name, **{"model.attention.combine": combine}))
    tokens = torch.randint(0, 256, (2, 45))  # T - 1 = 44: not a multiple of s or B
    loss = lm_losses(model(tokens[:, :-1]), tokens[:, 1:])[0]
    assert math.isfinite(loss.item()) and abs(loss.item() - math.log(260)) < 0.5
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, f"{pname} got a zero gradient"


@pytest.mark.parametrize("name", ["fs", "fsl"])
def test_initialisation_and_buffers(name):
    model = build_model(tiny(name, **{"model.attention.combine": "gate", "model.attention.sigma": 3.0}))
    for layer in model.layers:
        attn = layer.attn
        assert isinstance(attn, FreeSoloAttention)
        assert torch.equal(attn.readout_gain(), torch.full((2, 16), 0.03))  # model.attention.readout_gain
    log_form = build_model(tiny(name, **{"model.attention.readout_gain_param": "log"}))
    for layer in log_form.layers:
        assert torch.equal(layer.attn.lr_norm_log_gain, torch.full((2, 16), math.log(0.03)))
        torch.testing.assert_close(layer.attn.readout_gain(), torch.full((2, 16), 0.03))
        assert torch.equal(attn.w_gate.bias, torch.zeros(2))
        assert torch.equal(attn.sigma, torch.full((2,), 3.0)) and torch.equal(attn.lam, torch.ones(2))
        assert not attn.sigma.requires_grad
    state = model.state_dict()
    assert "layers.0.attn.sigma" in state and "layers.0.attn.lam" in state
    assert all("sigma" not in n and "lam" not in n for n, _ in model.named_parameters())
    sep = build_model(tiny(name, **{"model.attention.combine": "separate_wo"}))
    std = sep.layers[0].attn.wo_lr.weight.std().item()
    assert std == pytest.approx(0.02 / math.sqrt(4), rel=0.2)  # residual-scaled like wo


@pytest.mark.parametrize("name", ["fs", "fsl"])
def test_future_tokens_never_change_earlier_logits(name):
    torch.manual_seed(0)
    assert_future_tokens_do_not_change_past(build_model(tiny(name)).double(), atol=1e-12)


@pytest.mark.parametrize("combine", COMBINES)
@pytest.mark.parametrize("name", ["fs", "fsl"])
def test_layer_is_the_spec_composition(name, combine):
    """Local branch on RoPE'd q/k, long-range branch on the same unrotated q/k/v, combined per mode."""
    torch.manual_seed(1)
    cfg = tiny(name, **{"model.attention.combine": combine})
    attn = FreeSoloAttention(cfg, 0).double()
    with torch.no_grad():
        attn.lr_norm_weight.normal_()
        if combine == "gate":
            attn.w_gate.bias.normal_()
    x = torch.randn(2, 29, 32, dtype=torch.float64)
    a = cfg.attention
    q, k, v = (w(x).view(2, 29, 2, 16) for w in (attn.wq, attn.wk, attn.wv))
    local = sliding_window_attention(q, k, v, window=a.window, rope_theta=a.rope_theta)
    lr = long_range_attention(q, k, v,
                              fs_config(name, cell_size=4, block_size=8, top_k=2, recent_cells=1, retained_cells=3),
                              fs_prior(sigma=a.sigma, lam=a.lam), rms_weight=attn.lr_norm_weight)
    if combine == "sum":
        want = attn.wo((local + lr).flatten(2))
    elif combine == "gate":
        want = attn.wo((local + torch.sigmoid(attn.w_gate(x))[..., None] * lr).flatten(2))
    else:
        want = attn.wo(local.flatten(2)) + attn.wo_lr(lr.flatten(2))
    torch.testing.assert_close(attn(x), want, rtol=1e-12, atol=1e-12)
    assert lr[:, :8].abs().max() == 0 and lr[:, 8:].abs().min(-1).values.gt(0).all()


def test_sigma_and_lam_get_no_gradient_and_steer_routing():
    torch.manual_seed(0)
    attn = FreeSoloAttention(tiny("fs"), 0)
    x = torch.randn(1, 40, 32)
    base = attn(x)
    base.sum().backward()
    assert attn.sigma.grad is None and attn.lam.grad is None
    with torch.no_grad():
        attn.lam.fill_(50.0)  # a strong prior moves the selection
        assert not torch.allclose(attn(x), base)


def test_non_freesolo_name_is_rejected():
    with pytest.raises(ValueError, match="model.name"):
        FreeSoloAttention(tiny("fs").__class__(name="tfpp"), 0)


def test_readout_gain_sets_the_initial_gain_and_zero_makes_fs_the_swa_model():
    """The long-range read is added after its RMSNorm gain: at gain 0 an FS model computes
    exactly what SWA computes with the same weights, at any other gain it does not."""
    cfg_fs = tiny("fs", **{"model.attention.readout_gain": 0.0, "model.attention.readout_gain_param": "linear"})
    torch.manual_seed(0)
    fs = build_model(cfg_fs).double()
    assert all(torch.equal(layer.attn.lr_norm_weight, torch.zeros(2, 16)) for layer in fs.layers)
    swa = build_model(tiny("swa")).double()
    missing, unexpected = swa.load_state_dict(fs.state_dict(), strict=False)
    assert not missing and all(k.endswith(("lr_norm_weight", "sigma", "lam")) for k in unexpected)
    tokens = torch.randint(0, 256, (2, 40))
    torch.testing.assert_close(fs(tokens), swa(tokens), rtol=0, atol=1e-12)
    with torch.no_grad():
        for layer in fs.layers:
            layer.attn.lr_norm_weight.fill_(0.03)
    assert (fs(tokens) - swa(tokens)).abs().max() > 1e-6


def test_the_log_gain_is_the_gain_the_read_uses():
    """readout_gain_param=log learns log g: the layer reads with exp of it, gradients reach it
    (d/dlog g = g d/dg), and a gain of 0 cannot be asked for."""
    torch.manual_seed(0)
    log_cfg = tiny("fs", **{"model.attention.readout_gain": 0.2, "model.attention.readout_gain_param": "log"})
    lin_cfg = tiny("fs", **{"model.attention.readout_gain": 0.2, "model.attention.readout_gain_param": "linear"})
    log_attn, lin_attn = FreeSoloAttention(log_cfg, 0).double(), FreeSoloAttention(lin_cfg, 0).double()
    with torch.no_grad():  # both in fp64 (their init was rounded to fp32)
        log_attn.lr_norm_log_gain.fill_(math.log(0.2))
        lin_attn.lr_norm_weight.fill_(0.2)
    shared = {k: v for k, v in lin_attn.state_dict().items() if k != "lr_norm_weight"}
    log_attn.load_state_dict(shared, strict=False)
    assert not hasattr(log_attn, "lr_norm_weight") and not hasattr(lin_attn, "lr_norm_log_gain")
    x = torch.randn(2, 40, 32, dtype=torch.float64)
    torch.testing.assert_close(log_attn(x), lin_attn(x), rtol=1e-12, atol=1e-12)
    log_attn(x).square().sum().backward()
    lin_attn(x).square().sum().backward()
    torch.testing.assert_close(log_attn.lr_norm_log_gain.grad, 0.2 * lin_attn.lr_norm_weight.grad)
    with pytest.raises(ValueError, match="readout_gain_param=log"):
        tiny("fs", **{"model.attention.readout_gain": 0.0, "model.attention.readout_gain_param": "log"})


def test_unit_backward_reads_the_same_and_teaches_the_branch_as_at_gain_1():
    """readout_backward=unit: the same forward and the same gain gradient as the true backward,
    while q/k/v get the gradient of a read at gain 1 (at gain 1 both backwards are equal)."""
    torch.manual_seed(0)
    x = torch.randn(2, 40, 32, dtype=torch.float64)

    def grads(gain: float, backward: str):
        torch.manual_seed(1)
        attn = FreeSoloAttention(tiny("fs", **{"model.attention.readout_gain": gain,
                                               "model.attention.readout_backward": backward}), 0).double()
        out = attn(x)
        out.square().sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in attn.named_parameters()}

    quiet_unit, quiet_true = grads(0.03, "unit"), grads(0.03, "gain")
    torch.testing.assert_close(quiet_unit[0], quiet_true[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(quiet_unit[1]["lr_norm_weight"], quiet_true[1]["lr_norm_weight"])
    assert not torch.allclose(quiet_unit[1]["wv.weight"], quiet_true[1]["wv.weight"])
    loud_unit, loud_true = grads(1.0, "unit"), grads(1.0, "gain")
    for name in loud_true[1]:
        torch.testing.assert_close(loud_unit[1][name], loud_true[1][name], rtol=1e-10, atol=1e-12)


def test_negative_readout_gain_is_refused():
    with pytest.raises(ValueError, match="model.attention.readout_gain"):
        tiny("fs", **{"model.attention.readout_gain": -0.1})


@pytest.mark.parametrize("recipe", ["quickstart", "fs-340m", "fsl-340m-cpt"])
def test_recipes_start_the_read_at_the_default_gain(recipe):
    from fsframework.config import AttentionConfig
    from tests.utils import REPO

    cfg = load_config(REPO / "yamls" / f"{recipe}.yaml")
    assert cfg.model.attention.readout_gain == AttentionConfig().readout_gain
