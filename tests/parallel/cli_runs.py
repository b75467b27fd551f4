"""The tiny training job the parallel tests run under torchrun and on one rank, and the runs they
share: the one-rank baseline, 6 steps of 2 micro-batches (one rank accumulating both, ZeRO-2,
checkpoints at steps 3 and 6), the global batch of 2 data-parallel ranks; and the same job on 2
ranks under ZeRO-3 stopped at step 3 (the resize tests resume it on one rank, the export tests
merge its partitions)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.utils import REPO, TINY_DATA, TINY_MODEL, run_fsf

STEPS = 6
QUICKSTART = str(REPO / "yamls" / "quickstart.yaml")
# 63 input tokens in blocks of 16: 4 blocks, the last one short, so SP=2 slices are [0, 32) and [32, 63)
COMMON = [*TINY_DATA, *TINY_MODEL, "model.attention.block_size=16", f"train.max_steps={STEPS}", "train.ckpt_every=3",
          "optim.warmup_steps=2", "train.progress=false", "train.tensorboard=false"]
ONE_RANK = ["parallel.grad_accum=2"]  # the global batch of 2 ranks


def torchrun(nproc: int, *args: str, env: dict | None = None, check: bool = True,
             module: str = "fsframework", agent: list[str] | None = None) -> subprocess.CompletedProcess:
    """`fsf ARGS` on `nproc` ranks; `module="tests.faults"` injects the fault of `env`'s FSF_FAULT;
    `agent`: the command in place of torchrun's own (`fsf launch`'s, `launcher.plan.agent_command`)."""
    from tests.parallel.ranks import free_port

    cmd = [*(agent or [sys.executable, "-m", "torch.distributed.run"]), "--nproc_per_node", str(nproc), "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), "-m", module, *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=280,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
                               **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"torchrun {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def launch(nproc: int, *train: str, options: tuple[str, ...] = (), env: dict | None = None) -> subprocess.CompletedProcess:
    """`fsf launch` of the job `train_args` describes on one node of `nproc` CPU ranks (and `options` of
    `fsf launch`): the launcher snapshots the code and config into the run directory and starts
    torchrun from the snapshot."""
    assert train[0] == "train", train
    cmd = [sys.executable, "-m", "fsframework", "launch", *train[1:], "--nodes", "1", "--gpus-per-node", str(nproc),
           *options]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=280,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
                               **(env or {})})
    assert proc.returncode == 0, f"fsf launch {' '.join(train[1:])} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def train_args(run_dir: Path, data_cache: str, *extra: str) -> list[str]:
    return ["train", QUICKSTART, f"run_dir={run_dir}", f"data.cache_dir={data_cache}", *COMMON, *extra]


def losses(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, len(records) + 1))
    return [r["loss"] for r in records]


def assert_close(got: list[float], want: list[float], steps=range(1, STEPS + 1), rel: float = 1e-4) -> None:
    """Losses of `steps` (1-based) equal within `rel`: fp32 sums in another order across ranks."""
    assert len(want) == STEPS and len(got) >= max(steps), (len(got), len(want))
    for step in steps:
        a, b = got[step - 1], want[step - 1]
        assert abs(a - b) <= rel * abs(b), f"step {step}: loss {a} vs {b} (relative {abs(a - b) / abs(b):.1e})"


def rewind(run: Path, to: Path, step: int) -> Path:
    """A copy of `run` as it stood after `step` (its checkpoint there is what a run stopped at
    `step` writes; the later checkpoints are removed, the resumed run rewrites the later metrics)."""
    shutil.copytree(run, to)
    for later in (to / "checkpoints").glob("step_*"):
        if int(later.name.split("_")[1]) > step:
            shutil.rmtree(later)
    (to / "checkpoints" / "latest").write_text(f"step_{step:08d}")
    return to


@pytest.fixture(scope="session")
def one_rank_two_micro_batches(tmp_path_factory, data_cache) -> Path:
    """The baseline of every data-parallel comparison: one rank, ZeRO-2, accumulating the 2
    micro-batches 2 ranks read (mosaicml-streaming hands out the same samples either way).
    Read only: a test that resumes it copies it first."""
    run_dir = tmp_path_factory.mktemp("one_rank_zero2_accum2")
    run_fsf(*train_args(run_dir, data_cache, "parallel.zero_stage=2", *ONE_RANK))
    assert len(losses(run_dir)) == STEPS
    return run_dir


@pytest.fixture(scope="session")
def two_rank_zero3_stopped_at_3(tmp_path_factory, data_cache) -> Path:
    """The job on 2 data-parallel ranks under ZeRO-3 (each holds half of every tensor), stopped at
    step 3 with its checkpoint there. Read only: a test that resumes it copies it first."""
    run_dir = tmp_path_factory.mktemp("two_rank_zero3") / "run"
    torchrun(2, *train_args(run_dir, data_cache, "parallel.zero_stage=3", "train.stop_at_step=3"))
    assert len(losses(run_dir)) == 3
    return run_dir
