"""Run directories written before schema_version 2 keep working: their config.yaml (no
schema_version, model.max_seq_len and train.copy_warmup_* present) is migrated when resumed,
evaluated, converted or used as `train.init_from`. So do those of schema 3, whose kind settings
were flat keys (model.attention.rewired_score, ...)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fsframework.checkpoints import RunDir, read_config, resolve_checkpoint
from fsframework.checkpoints.writing import write_manifest
from fsframework.config import SCHEMA_VERSION
from tests.utils import REPO, TINY_DATA, TINY_MODEL, run_fsf

COMMON = [*TINY_DATA, *TINY_MODEL, "model.name=tfpp", "train.progress=false", "train.tensorboard=false",
          "optim.warmup_steps=1"]
WARMUP = ["research.copy_warmup_steps=1", "research.copy_warmup_seq_len=32", "research.copy_warmup_max_passage=8",
          "research.copy_warmup_draw=200"]


def as_version_1(text: str) -> str:
    """A current config.yaml rewritten as the code before schema_version 2 saved it (as the
    fixtures tests/fixtures/config_v1_*.yaml, which that code wrote)."""
    data = yaml.safe_load(text)
    assert data.pop("schema_version") == SCHEMA_VERSION
    for added in ("readout_gain_lr", "readout_gain_param", "readout_backward"):  # added in schema 3
        del data["model"]["attention"][added]
    for group in ("fsb", "rewired"):  # added (as flat keys) after schema 2
        del data["model"]["attention"][group]
    data["model"]["max_seq_len"] = 4096
    data["train"].update({f"copy_warmup_{key}": data["research"][f"copy_warmup_{key}"]
                          for key in ("steps", "seq_len", "max_passage", "draw")})
    del data["research"]
    return yaml.safe_dump(data, sort_keys=False)


def as_version_3(text: str) -> str:
    """A current config.yaml rewritten as the code of schema 3 saved it: each kind's own settings
    as flat keys of model.attention (fsb_top_k, rewired_score, ...)."""
    data = yaml.safe_load(text)
    assert data["schema_version"] == SCHEMA_VERSION
    data["schema_version"] = 3
    attention = data["model"]["attention"]
    for group in ("fsb", "rewired"):
        attention.update({f"{group}_{key}": value for key, value in attention.pop(group).items()})
    return yaml.safe_dump(data, sort_keys=False)


def _rewrite(run: RunDir, rewrite) -> None:
    """Rewrite the run's config.yaml and its checkpoint's (whose manifest records its size)."""
    ckpt = resolve_checkpoint(run.root)
    for path in (run.config, ckpt / "config.yaml"):
        path.write_text(rewrite(path.read_text()))
    (ckpt / "MANIFEST.json").unlink()
    write_manifest(ckpt)


@pytest.fixture(scope="module")
def old_run(tmp_path_factory, data_cache) -> Path:
    run = RunDir(tmp_path_factory.mktemp("old") / "run")
    run_fsf("train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={run.root}", f"data.cache_dir={data_cache}",
            *COMMON, *WARMUP, "train.max_steps=2", "train.ckpt_every=2")
    _rewrite(run, as_version_1)
    fixture_keys = set(yaml.safe_load((REPO / "tests/fixtures/config_v1_default.yaml").read_text()))
    assert set(yaml.safe_load(run.config.read_text())) == fixture_keys, "shaped like the saved fixture"
    return run.root


def test_old_config_reads_migrated(old_run):
    cfg = read_config(old_run)
    assert cfg.schema_version == SCHEMA_VERSION and cfg.research.copy_warmup_steps == 1
    a = cfg.model.attention
    # what a run of schema 2 used, not today's defaults (docs/freesolo.md §1.6)
    assert (a.readout_gain_param, a.readout_gain_lr, a.readout_backward) == ("linear", 1.0, "gain")
    assert cfg.research.copy_warmup_draw == 200


def test_eval_and_convert_of_an_old_run(old_run, tmp_path):
    out = tmp_path / "scores.json"
    run_fsf("eval", str(old_run), "--tasks", "perplexity", "--lengths", "64", "--num-samples", "2", "--out", str(out))
    assert set(json.loads(out.read_text())["scores"]["perplexity"]) == {"64"}
    proc = run_fsf("export", str(old_run), str(tmp_path / "export"))
    assert "largest |logit difference| source vs export (fp32): 0" in proc.stdout
    assert read_config(tmp_path / "export").schema_version == SCHEMA_VERSION


def test_init_from_an_old_run(old_run, tmp_path, data_cache):
    proc = run_fsf("train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={tmp_path / 'next'}",
                   f"data.cache_dir={data_cache}", *COMMON, f"train.init_from={old_run}", "train.max_steps=1")
    assert "initialised weights from" in proc.stdout


def test_resume_an_old_run_from_its_own_config(old_run, tmp_path, data_cache):
    import shutil

    run = RunDir(tmp_path / "resumed")
    shutil.copytree(old_run, run.root)
    proc = run_fsf("train", str(run.config), f"run_dir={run.root}", "train.max_steps=3")
    assert "resumed from step_00000002" in proc.stdout
    steps = [json.loads(line)["step"] for line in run.metrics.read_text().splitlines()]
    assert steps == [1, 2, 3]
    rewritten = yaml.safe_load(run.config.read_text())
    assert rewritten["schema_version"] == SCHEMA_VERSION and rewritten["research"]["copy_warmup_steps"] == 1


def test_a_schema_3_run_with_flat_kind_settings(tmp_path, data_cache):
    """A rewired run with its bilinear score, mean runway and head 1 as schema 3 saved them: the
    migrated config builds the model the checkpoint holds (Bmat included), which evaluates and resumes."""
    import shutil

    run = RunDir(tmp_path / "v3")
    settings = ["model.name=rewired", "model.attention.rewired.runway=mean", "model.attention.rewired.score=bilinear",
                "model.attention.rewired.head=1", "model.attention.fsb.top_k=3"]
    run_fsf("train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={run.root}", f"data.cache_dir={data_cache}",
            *COMMON, *settings, "train.max_steps=2", "train.ckpt_every=2")
    _rewrite(run, as_version_3)
    saved = yaml.safe_load(run.config.read_text())["model"]["attention"]
    assert (saved["rewired_score"], saved["rewired_head"], saved["fsb_top_k"]) == ("bilinear", 1, 3)
    a = read_config(run.root).model.attention
    assert (a.rewired.runway, a.rewired.score, a.rewired.head, a.fsb.top_k) == ("mean", "bilinear", 1, 3)
    out = tmp_path / "scores.json"
    run_fsf("eval", str(run.root), "--tasks", "perplexity", "--lengths", "64", "--num-samples", "2", "--out", str(out))
    assert set(json.loads(out.read_text())["scores"]["perplexity"]) == {"64"}
    resumed = RunDir(tmp_path / "resumed")
    shutil.copytree(run.root, resumed.root)
    proc = run_fsf("train", str(resumed.config), f"run_dir={resumed.root}", "train.max_steps=3")
    assert "resumed from step_00000002" in proc.stdout
    rewritten = yaml.safe_load(resumed.config.read_text())
    assert rewritten["schema_version"] == SCHEMA_VERSION
    assert rewritten["model"]["attention"]["rewired"] == {"runway": "mean", "score": "bilinear", "head": 1}
