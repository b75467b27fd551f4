"""Checkpoint integrity: every file's digest is checked on resume, a damaged checkpoint is
skipped with a message, and pruning never lets a damaged checkpoint push out a good one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fsframework.checkpoints import CheckpointError, find_latest, verify
from fsframework.checkpoints.writing import prune
from tests.utils import REPO, TINY_DATA, TINY_MODEL, run_fsf

STEPS = 12


def _train(run_dir: Path, data_cache: str, *extra: str):
    return run_fsf("train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={run_dir}",
                   f"data.cache_dir={data_cache}", *TINY_DATA, *TINY_MODEL, "model.name=tfpp",
                   f"train.max_steps={STEPS}", "train.ckpt_every=4", "optim.warmup_steps=2", "train.progress=false",
                   "train.tensorboard=false", "train.keep_checkpoints=2", *extra)


@pytest.fixture(scope="module")
def run_at_8(tmp_path_factory, data_cache) -> Path:
    """A run stopped at step 8: checkpoints step 4 and step 8 on disk."""
    run_dir = tmp_path_factory.mktemp("integrity")
    _train(run_dir, data_cache, "train.stop_at_step=8")
    return run_dir


def _copy(run: Path, tmp_path: Path) -> Path:
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def _engine_file(ckpt: Path) -> Path:
    return max(ckpt.rglob("*model_states.pt"), key=lambda p: p.stat().st_size)


def test_manifest_records_a_digest_of_every_file(run_at_8):
    ckpt = run_at_8 / "checkpoints" / "step_00000008"
    files = json.loads((ckpt / "MANIFEST.json").read_text())["files"]
    on_disk = {str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file() and p.name != "MANIFEST.json"}
    assert set(files) == on_disk
    assert all(len(entry["xxh64"]) == 16 and entry["size"] > 0 for entry in files.values())


@pytest.mark.parametrize("damage", ["same_size", "truncated", "missing"])
def test_damaged_checkpoint_is_caught(run_at_8, tmp_path, damage):
    run = _copy(run_at_8, tmp_path)
    ckpt = run / "checkpoints" / "step_00000008"
    victim = _engine_file(ckpt)
    if damage == "same_size":  # bytes overwritten in place: the size alone does not tell
        data = bytearray(victim.read_bytes())
        data[len(data) // 2: len(data) // 2 + 64] = bytes(64)
        victim.write_bytes(bytes(data))
    elif damage == "truncated":
        victim.write_bytes(victim.read_bytes()[:100])
    else:
        victim.unlink()
    with pytest.raises(CheckpointError, match=victim.name):
        verify(ckpt)
    messages = []
    assert find_latest(run / "checkpoints", log=messages.append).name == "step_00000004"
    assert "step_00000008" in messages[0]


def test_older_manifests_without_digests_still_verify(run_at_8, tmp_path):
    run = _copy(run_at_8, tmp_path)
    manifest = run / "checkpoints" / "step_00000008" / "MANIFEST.json"
    files = json.loads(manifest.read_text())["files"]
    manifest.write_text(json.dumps({"files": {rel: entry["size"] for rel, entry in files.items()}}))
    verify(manifest.parent)


def test_pruning_counts_only_good_checkpoints_and_keeps_the_resume_source(run_at_8, tmp_path):
    run = _copy(run_at_8, tmp_path)
    root = run / "checkpoints"
    step4, step8 = root / "step_00000004", root / "step_00000008"
    _engine_file(step8).write_bytes(b"garbage")
    # one good checkpoint left (step 4): nothing may be deleted to make room for keep=2
    assert prune(root, keep=2) == [] and step4.is_dir()
    # with keep=1 the damaged step 8 does not count; step 4 is the newest good one and stays
    assert prune(root, keep=1) == [] and step4.is_dir()
    fake_newer = root / "step_00000012"
    shutil.copytree(step4, fake_newer)  # a good checkpoint newer than both
    # the damaged step 8 goes; step 4, the resume source, is protected
    assert prune(root, keep=1, protect=step4) == [step8] and step4.is_dir()
    assert prune(root, keep=1) == [step4] and fake_newer.is_dir()


def test_resume_after_damage_keeps_the_good_checkpoint_it_resumed_from(run_at_8, tmp_path, data_cache):
    run = _copy(run_at_8, tmp_path)
    root = run / "checkpoints"
    _engine_file(root / "step_00000008").write_bytes(b"garbage")
    (root / ".tmp-step_00000012").mkdir()  # a half-written checkpoint of a killed run
    proc = _train(run, data_cache)
    assert "skipping checkpoint" in proc.stdout and "resumed from step_00000004" in proc.stdout
    names = sorted(p.name for p in root.glob("step_*"))
    # resumed from 4, saved 8 (replacing the damaged one) and 12; keep=2, and 4 is protected
    assert names == ["step_00000004", "step_00000008", "step_00000012"]
    assert not (root / ".tmp-step_00000012").exists()
    for name in names:
        verify(root / name)
