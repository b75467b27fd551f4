"""A resume compares the checkpoint's config with the new one: what the checkpoint holds may not
change (one line, nothing on disk touched); optimizer and schedule changes are applied, named."""

import json
import re
from pathlib import Path

import pytest

from tests.utils import REPO, TINY_DATA, TINY_MODEL, run_fsf


def _train(run_dir: Path, data_cache: str, *extra: str, check: bool = True):
    return run_fsf("train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={run_dir}",
                   f"data.cache_dir={data_cache}", *TINY_DATA, *TINY_MODEL, "model.name=tfpp", "train.max_steps=4",
                   "train.ckpt_every=2", "optim.warmup_steps=0", "optim.decay=constant", "train.progress=false",
                   "train.tensorboard=false", *extra, check=check)


@pytest.fixture()
def half_run(tmp_path, data_cache) -> Path:
    run_dir = tmp_path / "run"
    _train(run_dir, data_cache, "train.stop_at_step=2")
    return run_dir


def _files(run_dir: Path) -> dict:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("change", [["model.d_model=64"], ["model.n_layers=3", "data.seq_len=32"]],
                         ids=["d_model", "layers_and_seq_len"])
def test_a_changed_model_is_refused_naming_the_keys(half_run, data_cache, change):
    before = _files(half_run)
    proc = _train(half_run, data_cache, *change, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot resume" in lines[0], proc.stderr
    for key in change:
        assert key.split("=")[0] in lines[0]
    assert _files(half_run) == before  # config.yaml and every checkpoint as they were


def test_fewer_steps_than_the_run_has_done_are_refused_and_nothing_is_touched(half_run, data_cache):
    before = _files(half_run)
    proc = _train(half_run, data_cache, "train.max_steps=1", check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "at step 2 with train.max_steps=1" in lines[0] and "already past it" in lines[0]
    assert _files(half_run) == before  # config.yaml still says what the run trained


def test_a_changed_learning_rate_is_applied_with_a_notice(half_run, data_cache):
    proc = _train(half_run, data_cache, "optim.lr=0.0005")
    notice = [line for line in proc.stdout.splitlines() if "changed optimizer settings" in line]
    assert len(notice) == 1 and "optim.lr 0.002 -> 0.0005" in notice[0], proc.stdout
    records = [json.loads(line) for line in (half_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in records if r["step"] > 2] == [0.0005, 0.0005]
    assert "lr: 0.0005" in (half_run / "config.yaml").read_text()


def test_fsb_read_settings_may_change_on_resume_the_rewired_ones_may_not():
    """FS-B's group reads the same weights another way; the rewired group changes the model."""
    from fsframework.config import Config
    from fsframework.train.resume_config import changed_keys

    saved, now = Config(), Config()
    now.model.attention.fsb.top_k, now.model.attention.fsb.calibration = 8, "tau.json"
    now.model.attention.rewired.score = "bilinear"
    changed = changed_keys(saved, now)
    assert changed["refused"] == ["model.attention.rewired.score"] and not changed["applied"]
    assert changed["given"] == ["model.attention.fsb.calibration", "model.attention.fsb.top_k"]


def test_every_config_key_has_a_resume_rule_and_the_docs_list_every_rule():
    from dataclasses import asdict

    from fsframework.config import Config
    from fsframework.train.resume_config import RESUME_RULES, _flat, resume_rule

    for key in _flat(asdict(Config())):
        resume_rule(key)  # raises for a key no rule covers: a new config key must say what a resume does
    docs = (REPO / "docs" / "training.md").read_text()
    table = dict(re.findall(r"^\| `([a-z_.]+)` \| (refused|applied|announced|given) \|", docs, flags=re.M))
    assert table == RESUME_RULES


def test_a_changed_batch_size_is_announced(half_run, data_cache):
    proc = _train(half_run, data_cache, "data.micro_batch_size=4", "train.log_every=100")
    notice = [line for line in proc.stdout.splitlines() if "changed data settings" in line]
    assert len(notice) == 1 and "data.micro_batch_size 2 -> 4" in notice[0], proc.stdout
    assert "train.log_every" not in proc.stdout  # a given key goes without a word
    assert ("step_00000002 is kept beside the newest train.keep_checkpoints=2 while this run lasts (up to 3 "
            "checkpoints)") in proc.stdout
