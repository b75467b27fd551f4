"""Signals on real runs: a preemption signal checkpoints at the next step boundary on every
rank and exits 75 (a SLURM requeue resumes from it); SIGINT stops and names the checkpoint a
rerun resumes from; a NaN loss stops the run, or skips its update on every rank (train.nonfinite)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsframework.checkpoints import find_latest
from fsframework.train.preemption import EXIT_INTERRUPTED, EXIT_PREEMPTED
from tests.utils import REPO, TINY_DATA, TINY_MODEL, run_fsf

QUICKSTART = str(REPO / "yamls" / "quickstart.yaml")


def _args(run_dir: Path, data_cache: str, *extra: str) -> list[str]:
    return ["train", QUICKSTART, f"run_dir={run_dir}", f"data.cache_dir={data_cache}", *TINY_DATA, *TINY_MODEL,
            "model.name=tfpp", "train.max_steps=100000", "train.ckpt_every=100000", "optim.warmup_steps=2",
            "train.progress=false", "train.tensorboard=false", *extra]


def _steps_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def _signal_after_steps(cmd: list[str], run_dir: Path, steps: int, send, env: dict | None = None):
    """Start `cmd`, wait until `steps` more steps are logged, call `send(process)`; return (code, stdout, stderr)."""
    before = _steps_logged(run_dir)
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})})
    try:
        deadline = time.monotonic() + 120
        while _steps_logged(run_dir) < before + steps:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        send(proc)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


def _step(ckpt: Path) -> int:
    return int(ckpt.name.split("_")[-1])


def test_sigterm_checkpoints_and_exits_for_requeue_then_sigint_names_the_resume_checkpoint(tmp_path, data_cache):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "fsframework", *_args(run_dir, data_cache)]
    code, out, err = _signal_after_steps(cmd, run_dir, 3, lambda p: p.send_signal(signal.SIGTERM))
    assert code == EXIT_PREEMPTED, out + err
    saved = find_latest(run_dir / "checkpoints")
    assert saved is not None and _step(saved) == _steps_logged(run_dir) >= 3  # the step it stopped at
    assert f"preempted (SIGTERM) at step {_step(saved)}" in out and f"exiting with code {EXIT_PREEMPTED}" in out

    code, out, err = _signal_after_steps(cmd, run_dir, 2, lambda p: p.send_signal(signal.SIGINT))
    assert code == EXIT_INTERRUPTED, out + err
    assert f"resumed from {saved.name}" in out
    assert f"a rerun resumes from {saved} (step {_step(saved)})" in " ".join(out.split())
    assert "Traceback" not in err and find_latest(run_dir / "checkpoints") == saved  # SIGINT writes nothing


def test_a_second_sigint_aborts_a_step_that_does_not_end(tmp_path, data_cache):
    """Step 4 blocks in a system call that the kernel restarts after a signal (like a long kernel or
    a collective), so no Python handler runs: the first SIGINT waits for a boundary that never
    comes, the second ends the process at once with one line naming the checkpoint of step 2."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "tests.faults", *_args(run_dir, data_cache, "train.ckpt_every=2")]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
                                 "FSF_FAULT": "stall:0:4"})
    try:
        deadline = time.monotonic() + 120
        while _steps_logged(run_dir) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        time.sleep(0.5)  # into step 4
        proc.send_signal(signal.SIGINT)
        with pytest.raises(subprocess.TimeoutExpired):  # the first waits for the end of the step
            proc.wait(timeout=2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_INTERRUPTED, out + err
    saved = run_dir / "checkpoints" / "step_00000002"
    assert err.strip().splitlines() == [f"aborted by a second SIGINT during step 4, without a checkpoint: a rerun "
                                        f"resumes from {saved} (step 2)"], err
    assert find_latest(run_dir / "checkpoints") == saved


def test_a_nan_loss_skips_its_update_under_zero2(tmp_path, data_cache, monkeypatch):
    """One rank under ZeRO-2 (whose optimizer differs from ZeRO-3's, which the two-rank test below
    runs): train.nonfinite=skip leaves the weights of the NaN step as they were, the next step
    trains, and DeepSpeed's zero_to_fp32.py reads the checkpoint with its default arguments."""
    from tests.faults import inject

    inject(monkeypatch, "nan:0:2")
    run_dir = tmp_path / "run"
    run_fsf(*_args(run_dir, data_cache, "parallel.zero_stage=2", "train.nonfinite=skip", "train.max_steps=3",
                   "train.ckpt_every=1", "train.keep_checkpoints=1000"))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("update_skipped", 0) for r in records[:3]] == [0, 1, 0]
    _assert_step_2_skipped_and_read_by_deepspeed(run_dir, tmp_path / "fp32", monkeypatch)


@pytest.mark.ranks
def test_a_preemption_signal_to_one_rank_checkpoints_every_rank(tmp_path, data_cache, monkeypatch):
    """2 ranks under ZeRO-3, one torchrun launch: a NaN on one rank skips the update on both; a
    preemption signal to one rank checkpoints both; DeepSpeed's zero_to_fp32.py reads the
    checkpoints with its default arguments. (ZeRO-2's skip: the one-rank test above.)"""
    import psutil
    import torch

    from tests.parallel.ranks import free_port

    run_dir = tmp_path / "run"
    # a NaN on rank 1 at step 2 (train.nonfinite=skip): every rank skips that update
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "-m", "tests.faults",
           *_args(run_dir, data_cache, "parallel.zero_stage=3", "train.nonfinite=skip",
                  "train.ckpt_every=1", "train.keep_checkpoints=1000")]

    def signal_rank_1(proc):  # a signal that reached one rank only: the all-reduce tells the other
        workers = psutil.Process(proc.pid).children(recursive=True)
        rank1 = [w for w in workers if w.environ().get("RANK") == "1" and "tests.faults" in w.cmdline()]
        assert len(rank1) == 1, [w.cmdline() for w in workers]
        rank1[0].send_signal(signal.SIGUSR1)

    code, out, err = _signal_after_steps(cmd, run_dir, 3, signal_rank_1, env={"DS_ACCELERATOR": "cpu",
                                                                             "FSF_FAULT": "nan:1:2"})
    assert code != 0, out + err  # torchrun reports the ranks' exit code 75 as a failure
    assert f"exitcode  : {EXIT_PREEMPTED}" in err or f"exit code {EXIT_PREEMPTED}" in err + out, err
    saved = find_latest(run_dir / "checkpoints")
    assert saved is not None and _step(saved) == _steps_logged(run_dir)
    assert (saved / "client_rank0.pt").is_file() and (saved / "client_rank1.pt").is_file()
    assert f"preempted (a peer rank's preemption signal) at step {_step(saved)}" in out

    def strict(constant):
        raise AssertionError(f"metrics.jsonl holds {constant}, which is not standard JSON")

    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line, parse_constant=strict) for line in lines]
    assert [r.get("update_skipped", 0) for r in records[:3]] == [0, 1, 0]
    assert records[1]["loss"] is None and isinstance(records[2]["loss"], float)  # the NaN, as null
    assert "step 2: loss nan, update skipped (1 in a row, 1 in all" in out  # rank 0 saw rank 1's NaN
    state = torch.load(run_dir / "checkpoints" / "step_00000003" / "client_rank0.pt", weights_only=False)
    assert state["train_state"]["skipped_steps"] == 1 and state["train_state"]["nonfinite_in_row"] == 0
    _assert_step_2_skipped_and_read_by_deepspeed(run_dir, tmp_path / "fp32", monkeypatch)


def _assert_step_2_skipped_and_read_by_deepspeed(run_dir: Path, out: Path, monkeypatch) -> None:
    """Checkpoints of steps 1-3: step 2's update left the weights as they were, step 3 trained, and
    DeepSpeed's zero_to_fp32.py reads step 3's weights as fsframework consolidates them."""
    import torch

    from fsframework.checkpoints import consolidated_state_dict

    weights = [consolidated_state_dict(run_dir / "checkpoints" / f"step_{s:08d}") for s in (1, 2, 3)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])  # step 2's update skipped
    assert not all(torch.equal(weights[1][k], weights[2][k]) for k in weights[1])  # step 3 trained
    by_deepspeed = _zero_to_fp32(run_dir / "checkpoints" / "step_00000003", out, monkeypatch)
    assert by_deepspeed.keys() == weights[2].keys()
    assert all(torch.equal(by_deepspeed[k], weights[2][k]) for k in by_deepspeed)


def _zero_to_fp32(ckpt: Path, out: Path, monkeypatch) -> dict:
    """The weights DeepSpeed's own script, copied into the checkpoint, writes when called the
    default way: from inside the folder, `python zero_to_fp32.py . OUT` (no tag). Run in this
    process (DeepSpeed is imported already) as `__main__`, exactly as the command line runs it."""
    import runpy

    import torch

    monkeypatch.chdir(ckpt)
    monkeypatch.setattr(sys, "argv", ["zero_to_fp32.py", ".", str(out)])
    runpy.run_path("zero_to_fp32.py", run_name="__main__")
    return torch.load(out / "pytorch_model.bin", weights_only=True)


def test_a_nan_loss_stops_the_run_naming_the_step_and_the_checkpoint(tmp_path, data_cache, monkeypatch):
    from tests.faults import inject

    inject(monkeypatch, "nan:0:3")
    run_dir = tmp_path / "stop"
    proc = run_fsf(*_args(run_dir, data_cache, "train.max_steps=4", "train.ckpt_every=2"), check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    message = " ".join(proc.stderr.split())
    assert "loss nan at step 3" in message and "the last good checkpoint is step_00000002" in message
