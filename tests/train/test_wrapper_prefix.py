"""Engine checkpoints written while the engine held the model inside a loss module name every
tensor "model.<name>". The engine now holds the model itself; such checkpoints still resume
exactly and load (`fsframework.checkpoints.without_wrapper_prefix`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from fsframework.checkpoints import ENGINE_TAG, consolidated_state_dict
from tests.utils import REPO, TINY_DATA, TINY_MODEL, run_fsf


class LossModule(nn.Module):
    """What the engine held before: the model as its submodule `model`."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)


def train(run_dir: Path, data_cache: str, *extra: str) -> list[float]:
    run_fsf("train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={run_dir}", f"data.cache_dir={data_cache}",
            *TINY_DATA, *TINY_MODEL, "model.name=tfpp", "train.max_steps=3", "train.ckpt_every=1",
            "optim.warmup_steps=1", "train.progress=false", "train.tensorboard=false", *extra)
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def engine_names(ckpt: Path) -> list[str]:
    return list(torch.load(ckpt / ENGINE_TAG / "mp_rank_00_model_states.pt", weights_only=False)["module"])


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_a_checkpoint_with_the_wrapper_prefix_resumes_exactly_and_loads(tmp_path, data_cache, monkeypatch,
                                                                         zero_stage):
    import deepspeed

    stage = f"parallel.zero_stage={zero_stage}"
    straight = train(tmp_path / "new", data_cache, stage)
    assert not any(name.startswith("model.") for name in engine_names(tmp_path / "new/checkpoints/step_00000002"))
    with monkeypatch.context() as patch:
        initialize = deepspeed.initialize
        patch.setattr(deepspeed, "initialize", lambda model, **kw: initialize(model=LossModule(model), **kw))
        train(tmp_path / "old", data_cache, stage, "train.stop_at_step=2")
    old = tmp_path / "old/checkpoints/step_00000002"
    assert all(name.startswith("model.") for name in engine_names(old))
    weights, want = consolidated_state_dict(old), consolidated_state_dict(tmp_path / "new/checkpoints/step_00000002")
    assert weights.keys() == want.keys() and all(torch.equal(weights[k], want[k]) for k in want)
    assert train(tmp_path / "old", data_cache, stage) == straight  # resumed at step 2 by today's engine
