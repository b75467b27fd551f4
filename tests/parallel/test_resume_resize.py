"""Resuming at another data-parallel size (docs/checkpoints.md): a ZeRO run stopped on 2 ranks
continues on 1 and one stopped on 1 continues on 2, optimizer state carried, and the losses go
on as those of a run that never changed size. The global batch stays the same: 2 ranks x 1
micro-batch, or 1 rank accumulating 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fsframework.checkpoints import CheckpointError, resolve_checkpoint
from fsframework.train.resize import Layout, check_layout, saved_layout
from tests.parallel.test_train_parallel import QUICKSTART, STEPS, torchrun
from tests.utils import TINY_DATA, TINY_MODEL, run_fsf

COMMON = [*TINY_DATA, *TINY_MODEL, "model.attention.block_size=16", f"train.max_steps={STEPS}", "train.ckpt_every=3",
          "optim.warmup_steps=2", "train.progress=false", "train.tensorboard=false"]
ONE_RANK = ["parallel.grad_accum=2"]  # the global batch of 2 ranks
pytestmark = [pytest.mark.ranks, pytest.mark.timeout(300)]


def train_args(run_dir: Path, data_cache: str, *extra: str) -> list[str]:
    return ["train", QUICKSTART, f"run_dir={run_dir}", f"data.cache_dir={data_cache}", *COMMON, *extra]


def losses(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, len(records) + 1))
    return [r["loss"] for r in records]


def assert_continues(resized: Path, reference: Path, rel: float = 1e-4) -> None:
    """Steps 4..6 of the resized run equal the reference's within `rel` (fp32 sums in another order)."""
    got, want = losses(resized), losses(reference)
    assert len(got) == len(want) == STEPS
    for step in range(4, STEPS + 1):
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


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_cache) -> Path:
    """One rank, ZeRO-2, never resized: checkpoints at steps 3 and 6."""
    run_dir = tmp_path_factory.mktemp("one_rank_zero2")
    run_fsf(*train_args(run_dir, data_cache, "parallel.zero_stage=2", *ONE_RANK))
    return run_dir


def test_one_rank_zero2_resumes_on_two(reference, tmp_path, data_cache):
    run_dir = rewind(reference, tmp_path / "grow", 3)
    proc = torchrun(2, *train_args(run_dir, data_cache, "parallel.zero_stage=2"))
    assert "resumed from step_00000003 at step 3 (written by another number of ranks; now 2)" in proc.stdout
    assert_continues(run_dir, reference)
    assert not list((run_dir / "checkpoints").glob(".tmp-*")), "the universal copy is removed after loading"
    assert saved_layout(resolve_checkpoint(run_dir)) == Layout(world_size=2, sp=1, zero_stage=2)


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_two_rank_zero_run_resumes_on_one(reference, tmp_path, data_cache, zero_stage):
    # ZeRO-3 needs `repair_zero3_universal_load`: without it step 6 is off by 4e-4
    run_dir = tmp_path / f"shrink{zero_stage}"
    torchrun(2, *train_args(run_dir, data_cache, f"parallel.zero_stage={zero_stage}", "train.stop_at_step=3"))
    proc = run_fsf(*train_args(run_dir, data_cache, f"parallel.zero_stage={zero_stage}", *ONE_RANK))
    assert "resumed from step_00000003 at step 3 (written by another number of ranks; now 1)" in proc.stdout
    assert_continues(run_dir, reference)


def test_another_sequence_parallel_size_or_zero_stage_is_refused_naming_both(reference):
    ckpt = reference / "checkpoints" / "step_00000003"
    saved = saved_layout(ckpt)
    assert saved == Layout(world_size=1, sp=1, zero_stage=2)
    check_layout(ckpt, saved, Layout(world_size=4, sp=1, zero_stage=2))  # another data-parallel size is fine
    with pytest.raises(CheckpointError, match=r"parallel\.sp=1 in the checkpoint, 2 in this run"):
        check_layout(ckpt, saved, Layout(world_size=2, sp=2, zero_stage=2))
    with pytest.raises(CheckpointError, match=r"parallel\.zero_stage=2 in the checkpoint, 3 in this run"):
        check_layout(ckpt, saved, Layout(world_size=1, sp=1, zero_stage=3))

