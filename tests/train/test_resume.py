"""Exact resume and atomic checkpoints, through the CLI as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fsframework.checkpoints import CheckpointError, find_latest, resolve_checkpoint, verify
from fsframework.checkpoints.writing import CRASH_ENV
from tests.utils import REPO, TINY_DATA, TINY_MODEL, read_ahead_threads, run_fsf, run_fsf_process

STEPS = 20


def _losses(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, len(records) + 1))
    return [r["loss"] for r in records]


def _train(run_dir: Path, data_cache: str, *extra: str, env: dict | None = None, check: bool = True, run=run_fsf):
    return run("train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={run_dir}",
                   f"data.cache_dir={data_cache}", *TINY_DATA, *TINY_MODEL, "model.name=tfpp",
                   f"train.max_steps={STEPS}", "train.ckpt_every=5", "optim.warmup_steps=4", "train.progress=false",
                   "train.tensorboard=false", *extra, env=env, check=check)


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory, data_cache) -> Path:
    run_dir = tmp_path_factory.mktemp("straight")
    _train(run_dir, data_cache)
    return run_dir


def test_straight_run_learns_and_writes_run_files(straight_run):
    losses = _losses(straight_run)
    assert len(losses) == STEPS
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5, "the loss must fall"
    assert (straight_run / "config.yaml").is_file()
    assert any((straight_run / "tensorboard").glob("events.*")) is False  # disabled in this test
    record = json.loads((straight_run / "metrics.jsonl").read_text().splitlines()[-1])
    for key in ("step", "loss", "lr", "tokens", "tokens_per_s", "grad_norm"):
        assert key in record


def test_resume_is_exact(straight_run, tmp_path, data_cache):
    others = frozenset(read_ahead_threads())  # another test's, in this process
    run_dir = tmp_path / "split"
    _train(run_dir, data_cache, "train.stop_at_step=10")
    assert len(_losses(run_dir)) == 10
    proc = _train(run_dir, data_cache)
    assert "resumed from step_00000010" in proc.stdout
    assert _losses(run_dir) == _losses(straight_run)
    # both runs were in this process (stopped mid-epoch): each ended its loader's read-ahead threads
    assert not read_ahead_threads(wait_s=5, besides=others)


def test_crash_while_writing_a_checkpoint_keeps_the_previous_one(straight_run, tmp_path, data_cache):
    run_dir = tmp_path / "crash"
    # a process of its own: the crash is os._exit in the middle of the write
    proc = _train(run_dir, data_cache, env={CRASH_ENV: "15"}, check=False, run=run_fsf_process)
    assert proc.returncode != 0
    ckpts = run_dir / "checkpoints"
    assert (ckpts / ".tmp-step_00000015").is_dir(), "the crash happened mid-write"
    assert (ckpts / "latest").read_text().strip() == "step_00000010"
    assert find_latest(ckpts).name == "step_00000010"
    # the metrics of steps 11..15 were logged before the crash; the resumed run rewrites them
    proc = _train(run_dir, data_cache)
    assert "resumed from step_00000010" in proc.stdout
    assert _losses(run_dir) == _losses(straight_run)
    assert not (ckpts / ".tmp-step_00000015").exists()
    # keep the last 2, and the checkpoint the run resumed from, which pruning never deletes
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_00000010", "step_00000015", "step_00000020"]


def test_damaged_latest_checkpoint_falls_back_and_is_reported(straight_run, tmp_path):
    import shutil

    run_dir = tmp_path / "copy"
    shutil.copytree(straight_run, run_dir)
    newest = run_dir / "checkpoints" / "step_00000020"
    victim = next(p for p in sorted(newest.rglob("*.pt")))
    victim.write_bytes(victim.read_bytes()[:100])  # truncated file
    with pytest.raises(CheckpointError, match=victim.name):
        verify(newest)
    messages = []
    assert find_latest(run_dir / "checkpoints", log=messages.append).name == "step_00000015"
    assert "step_00000020" in messages[0]
    with pytest.raises(CheckpointError, match="not found"):
        resolve_checkpoint(tmp_path / "nowhere")


def test_eval_of_a_checkpoint_reports_perplexity_beyond_training_length(straight_run, tmp_path):
    out = tmp_path / "scores.json"
    run_fsf("eval", str(straight_run), "--tasks", "perplexity", "--lengths", "64,256", "--out", str(out))
    scores = json.loads(out.read_text())["scores"]["perplexity"]
    assert set(scores) == {"64", "256"}
    assert all(1.0 < v < 300.0 for v in scores.values())


def test_convert_writes_an_export_with_logit_proof(straight_run, tmp_path):
    import shutil

    run_dir = tmp_path / "convert"
    shutil.copytree(straight_run, run_dir)
    proc = run_fsf("convert", str(run_dir))  # the alias of `fsf export`, into <checkpoint>/export
    assert "largest |logit difference| source vs export (fp32): 0" in proc.stdout
    assert (run_dir / "checkpoints" / "step_00000020" / "export" / "model.safetensors").is_file()



def _full_disk_then_resume(run_dir: Path, data_cache: str, straight_run: Path, failing_run,
                           make_room=lambda: None) -> None:
    """Checkpoint 15 meets a full disk (`failing_run()`): one line naming the directory and the space
    a checkpoint takes, exit 1, no partial files, checkpoint 10 intact; after `make_room()` a rerun
    resumes exactly."""
    proc = failing_run()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = [ln for ln in proc.stderr.splitlines() if "step_00000015 could not be written" in ln]
    assert len(line) == 1 and str(run_dir / "checkpoints") in line[0] and "MiB" in line[0], proc.stderr
    assert "Traceback" not in proc.stderr and "step_00000010 is intact" in line[0]
    ckpts = run_dir / "checkpoints"
    assert not list(ckpts.glob(".tmp-*")) and not (ckpts / "step_00000015").exists()
    assert find_latest(ckpts).name == "step_00000010"
    verify(ckpts / "step_00000010")
    make_room()
    proc = _train(run_dir, data_cache)
    assert "resumed from step_00000010" in proc.stdout
    assert _losses(run_dir) == _losses(straight_run)


def test_a_full_disk_at_a_checkpoint_stops_cleanly_and_a_rerun_resumes_exactly(straight_run, tmp_path, data_cache):
    """The disk fills as checkpoint 15 is written (rank 0's files fail with ENOSPC, injected: a
    filesystem of a set size is the next test's, where one can be mounted)."""
    from fsframework.checkpoints.writing import FULL_DISK_ENV

    run_dir = tmp_path / "full"
    _full_disk_then_resume(run_dir, data_cache, straight_run, lambda: _train(
        run_dir, data_cache, env={FULL_DISK_ENV: "15"}, check=False, run=run_fsf_process))


def test_a_small_filesystem_fills_at_a_checkpoint(straight_run, tmp_path, data_cache):
    """The same on a real tmpfs that holds two checkpoints and a half (pruning keeps two), mounted here
    and grown for the rerun."""
    import shutil
    import subprocess

    size = max(sum(f.stat().st_size for f in c.rglob("*") if f.is_file())
               for c in (straight_run / "checkpoints").glob("step_*"))
    mount = tmp_path / "small"
    mount.mkdir()
    size_kb = (5 * size // 2 + (256 << 10)) // 1024  # 2.5 checkpoints and the run's other files
    if shutil.which("mount") is None or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs is refused here (it needs root): the injected full disk above stands in")
    try:
        run_dir = mount / "run"
        _full_disk_then_resume(
            run_dir, data_cache, straight_run,
            lambda: _train(run_dir, data_cache, check=False, run=run_fsf_process),
            lambda: subprocess.run(["mount", "-o", f"remount,size={4 * size_kb}k", str(mount)], check=True))
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
