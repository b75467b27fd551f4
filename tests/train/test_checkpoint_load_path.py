"""The one load path (`fsframework.checkpoints.load_weights`): weights fit the model exactly or one
line names what does not; the engine's `model.` prefix, tied weights stored once and the models'
own renames of older names still load; nothing else in the package copies weights into a model."""

from __future__ import annotations

import ast

import pytest
import torch

from fsframework.checkpoints import FP32_FILE, CheckpointError, load_model, load_weights
from fsframework.checkpoints.writing import write_manifest
from fsframework.config import load_config
from fsframework.models.freesolo_attention import freesolo_layers
from fsframework.models.registry import build_model
from tests.export.helpers import SMALL, random_checkpoint
from tests.utils import REPO


def _model(kind: str = "tfpp", *overrides: str, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(load_config(None, [*SMALL, f"model.name={kind}", *overrides]).model)


def _error(model, state) -> str:
    with pytest.raises(CheckpointError) as info:
        load_weights(model, state, "weights file w.pt")
    message = str(info.value)
    assert "\n" not in message, message
    return message


def test_a_missing_tensor_is_one_line_naming_it_the_source_and_the_model():
    state = _model(seed=1).state_dict()
    del state["norm.weight"]
    assert _error(_model(), state) == "weights file w.pt does not fit model tfpp: missing 1: norm.weight"


def test_an_extra_tensor_is_one_line_naming_it():
    state = {**_model(seed=1).state_dict(), "layers.0.attn.extra": torch.zeros(3)}
    assert _error(_model(), state) == "weights file w.pt does not fit model tfpp: unexpected 1: layers.0.attn.extra"


def test_a_mis_shaped_tensor_is_refused_before_anything_is_copied():
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = _model("tfpp", "model.d_model=48", seed=1).state_dict()
    message = _error(model, state)
    assert message.startswith("weights file w.pt does not fit model tfpp: mis-shaped ")
    assert "embed.weight (260, 48) (model: (260, 32))" in message
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_long_list_is_cut_with_its_count():
    state = _model(seed=1).state_dict()
    dropped = [k for k in state if k.startswith("layers.")]
    message = _error(_model(), {k: v for k, v in state.items() if k not in dropped})
    assert f"missing {len(dropped)}: " in message and message.endswith(", ...")
    assert len(message.split(": ", 2)[2].split(", ")) == 9  # eight names, then "..."


def test_engine_names_and_a_tied_tensor_stored_once_load():
    source = _model("fs", "model.tie_embeddings=true", seed=1)
    state = {f"model.{k}": v for k, v in source.state_dict().items() if k != "lm_head.weight"}
    target = _model("fs", "model.tie_embeddings=true")
    load_weights(target, state, "engine state")
    assert target.lm_head.weight is target.embed.weight
    assert all(torch.equal(v, source.state_dict()[k]) for k, v in target.state_dict().items())


def test_the_models_own_renames_of_older_names_apply():
    source = _model("argrc", seed=1)
    old_names = {k.replace("scan.cell.", "cell.", 1): v for k, v in source.state_dict().items()}
    assert any(k.startswith("cell.") for k in old_names)
    target = _model("argrc")
    load_weights(target, old_names, "an AR-GRC checkpoint written before the cell moved under scan")
    assert all(torch.equal(v, source.state_dict()[k]) for k, v in target.state_dict().items())


def test_a_run_dir_whose_weights_carry_the_model_prefix_loads(tmp_path):
    """Checkpoints written before the weights were stored under the plain model's names."""
    run = random_checkpoint(tmp_path / "run", "fs", seed=3)
    ckpt = run / "checkpoints" / "step_00000001"
    plain = torch.load(ckpt / FP32_FILE, weights_only=True)
    torch.save({f"model.{k}": v for k, v in plain.items()}, ckpt / FP32_FILE)
    (ckpt / "MANIFEST.json").unlink()
    write_manifest(ckpt)
    model, cfg = load_model(run)
    assert cfg.model.name == "fs"
    assert all(torch.equal(v, plain[k]) for k, v in model.state_dict().items())


def test_the_routing_prior_follows_the_config_it_is_loaded_with(tmp_path):
    """sigma and lam are settings saved as buffers: an override on a saved run takes effect, and
    without one the saved run reads with its own."""
    run = random_checkpoint(tmp_path / "run", "fs", "model.attention.lam=2.0", "model.attention.sigma=3.0")
    model, _ = load_model(run)
    layers = freesolo_layers(model)
    assert layers and all(torch.all(m.lam == 2.0) and torch.all(m.sigma == 3.0) for m in layers)
    model, cfg = load_model(run, overrides=["model.attention.lam=5.0", "model.attention.sigma=7.0"])
    assert (cfg.model.attention.lam, cfg.model.attention.sigma) == (5.0, 7.0)
    assert all(torch.all(m.lam == 5.0) and torch.all(m.sigma == 7.0) for m in freesolo_layers(model))


def test_a_checkpoint_of_another_model_names_the_checkpoint_and_the_overrides(tmp_path):
    run = random_checkpoint(tmp_path / "run", "fs")
    with pytest.raises(CheckpointError, match=r"^checkpoint \S+model_fp32\.pt does not fit model tfpp with "
                                              r"model\.name=tfpp: unexpected \d+: "):
        load_model(run, overrides=["model.name=tfpp"])


# a `load_state_dict` call outside the load path that restores no model (a batch source's position),
# or restores the engine's own module on resume (DeepSpeed's load, strict): (file, receiver)
NOT_A_MODEL = {("fsframework/train/trainer.py", "self.source"), ("fsframework/data/sources.py", "self.inner"),
               ("fsframework/data/loader.py", "self.loader"), ("fsframework/train/resume.py", "dst"),
               ("fsframework/data/sample_loader.py", "self.dataset")}


def test_nothing_else_in_the_package_loads_weights_into_a_model():
    calls = []
    for path in sorted((REPO / "fsframework").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "load_state_dict":
                calls.append((rel, ast.unparse(node.func.value)))
    assert ("fsframework/checkpoints/loading.py", "model") in calls  # the scan sees the one path's call
    stray = [c for c in calls if c not in NOT_A_MODEL and c[0] != "fsframework/checkpoints/loading.py"]
    assert not stray, f"weights loaded outside fsframework.checkpoints.load_weights: {stray}"
