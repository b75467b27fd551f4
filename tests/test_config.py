"""Config errors fail early with a message naming the key; the CLI exits non-zero."""

from __future__ import annotations

import pytest

from fsframework.config import ConfigError, load_config
from tests.utils import REPO, run_fsf


@pytest.mark.parametrize("override, fragment", [
    ("model.nmae=fs", "model.nmae"),
    ("optim.lr=-0.1", "optim.lr"),
    ("train.max_steps=ten", "train.max_steps"),
    ("model.name=transformer", "model.name"),
    ("parallel.zero_stage=5", "parallel.zero_stage"),
], ids=["unknown-key", "negative-lr", "wrong-type", "unknown-model", "bad-zero-stage"])
def test_bad_override_names_the_key(override, fragment):
    with pytest.raises(ConfigError, match=fragment.replace(".", r"\.")):
        load_config(None, [override])


def test_freesolo_relations_are_checked():
    with pytest.raises(ConfigError, match="block_size=100 must be a multiple of model.attention.cell_size=32"):
        load_config(None, ["model.name=fs", "model.attention.block_size=100"])
    with pytest.raises(ConfigError, match=r"window=64 must be >= model.attention.block_size - 1 = 127"):
        load_config(None, ["model.name=fs", "model.attention.window=64"])
    with pytest.raises(ConfigError, match="d_model=100 must be a multiple of model.n_heads=3"):
        load_config(None, ["model.d_model=100", "model.n_heads=3"])


def test_unknown_key_in_yaml_file(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("model:\n  name: tfpp\n  layers: 3\n")
    with pytest.raises(ConfigError, match="model.layers"):
        load_config(path)


def test_override_without_equals_sign():
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["train.max_steps"])


def test_every_shipped_yaml_is_valid():
    for path in sorted((REPO / "yamls").glob("*.yaml")):
        if "eval" in path.stem:
            continue
        load_config(path)


def test_cli_rejects_bad_config_before_any_work(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_fsf("train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={run_dir}", "optim.lrr=0.1",
                   check=False)
    assert proc.returncode != 0
    assert "optim.lrr" in proc.stderr
    assert not run_dir.exists(), "nothing may be written for an invalid config"


def test_cli_config_prints_resolved_yaml():
    proc = run_fsf("config", str(REPO / "yamls" / "quickstart.yaml"), "train.max_steps=7")
    assert "max_steps: 7" in proc.stdout
