"""FreeSolo's readout gains (log g by default, or g) train in their own optimizer parameter
group at `model.attention.readout_gain_lr * optim.lr` (docs/freesolo.md §1.6)."""

from __future__ import annotations

import math

import torch

from fsframework.checkpoints import load_model
from fsframework.config import load_config
from fsframework.models.registry import build_model
from fsframework.train.trainer import param_groups
from tests.utils import REPO, TINY_MODEL, run_fsf


def _fs_model(*overrides: str):
    cfg = load_config(None, ["model.name=fs", *TINY_MODEL, "model.attention.window=16",
                             "model.attention.block_size=16", "model.attention.cell_size=8", *overrides])
    return build_model(cfg.model), cfg


def test_gains_form_their_own_group_with_their_own_lr():
    model, _ = _fs_model("model.attention.readout_gain_param=log")
    groups = param_groups(model, weight_decay=0.1, lr=2e-3, readout_gain_lr=30.0)
    gains = [p for name, p in model.named_parameters() if name.endswith("lr_norm_log_gain")]
    assert len(groups) == 3 and len(gains) == 2  # one gain tensor per layer
    assert {id(p) for p in groups[2]["params"]} == {id(p) for p in gains}
    assert groups[2]["lr"] == 2e-3 * 30.0 and groups[2]["weight_decay"] == 0.0
    assert all(g["lr"] == 2e-3 for g in groups[:2])
    every = [id(p) for g in groups for p in g["params"]]
    assert sorted(every) == sorted(id(p) for p in model.parameters()), "each parameter in exactly one group"


def test_multiplier_one_keeps_the_two_groups_old_runs_saved():
    model, _ = _fs_model()
    groups = param_groups(model, weight_decay=0.1, lr=2e-3, readout_gain_lr=1.0)
    assert len(groups) == 2, "an optimizer state of an older run (two groups) must still resume"
    tfpp = build_model(load_config(None, ["model.name=tfpp", *TINY_MODEL]).model)
    assert len(param_groups(tfpp, 0.1, 2e-3, readout_gain_lr=30.0)) == 2, "no gains: no third group"


def test_a_training_step_moves_the_gains_at_their_own_rate(tmp_path):
    """End to end through `fsf train` (the DeepSpeed engine and the schedule): Adam's first step
    moves every parameter by about its group's lr, so log g moves `readout_gain_lr` times as far
    as the RMSNorm weights of the blocks."""
    run = tmp_path / "run"
    lr, scale = 1e-4, 40.0
    run_fsf("train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={run}", "data.source=mqar",
            "data.seq_len=64", "data.micro_batch_size=4", "data.mqar.pairs=4", "data.mqar.queries=4",
            "model.name=fs", *TINY_MODEL, "model.attention.window=16", "model.attention.block_size=16",
            "model.attention.cell_size=8", "model.attention.readout_gain=0.5", "model.attention.readout_gain_param=log",
            f"model.attention.readout_gain_lr={scale}", f"optim.lr={lr}", "optim.warmup_steps=0",
            "optim.decay=constant", "optim.weight_decay=0", "train.max_steps=1", "train.ckpt_every=1",
            "train.eval_every=0", "train.progress=false", "train.tensorboard=false")
    model, cfg = load_model(run, torch.device("cpu"), [])
    assert cfg.model.attention.readout_gain_param == "log"
    log_gains = torch.cat([(p.detach() - math.log(0.5)).abs().flatten() for name, p in model.named_parameters()
                           if name.endswith("lr_norm_log_gain")])
    norms = torch.cat([(p.detach() - 1.0).abs().flatten() for name, p in model.named_parameters()
                       if "norm" in name and name.endswith("weight")])
    assert len(log_gains) and len(norms)
    assert abs(log_gains.median().item() - lr * scale) < 0.2 * lr * scale, log_gains.median()
    assert abs(norms.median().item() - lr) < 0.2 * lr, norms.median()
