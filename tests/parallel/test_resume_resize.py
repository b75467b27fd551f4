"""Resuming at another data-parallel size (docs/checkpoints.md): a ZeRO run stopped on 2 ranks
continues on 1 and one stopped on 1 continues on 2, optimizer state carried, and the losses go
on as those of a run that never changed size. The global batch stays the same: 2 ranks x 1
micro-batch, or 1 rank accumulating 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fsframework.checkpoints import CheckpointError, resolve_checkpoint
from fsframework.train.resize import Layout, check_resume_layout, saved_layout
from tests.parallel.cli_runs import ONE_RANK, STEPS, assert_close, launch, losses, rewind, torchrun, train_args
from tests.utils import run_fsf

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(300)]


def assert_continues(resized: Path, reference: Path) -> None:
    """Steps 4..6 of the resized run equal the reference's (fp32 sums in another order)."""
    got, want = losses(resized), losses(reference)
    assert len(got) == len(want) == STEPS
    assert_close(got, want, steps=range(4, STEPS + 1))


@pytest.fixture
def reference(one_rank_two_micro_batches) -> Path:
    """One rank, ZeRO-2, never resized: checkpoints at steps 3 and 6."""
    return one_rank_two_micro_batches


def test_one_rank_zero2_resumes_on_two_by_fsf_launch(reference, tmp_path, data_cache):
    """Also the real `fsf launch` of a CPU job (tests/launch covers its scripts and errors), and its
    restart: rank 1 is SIGKILLed after step 4, the whole job starts again from the newest checkpoint
    (`--max-restarts 1`), and the losses are the uninterrupted run's."""
    from fsframework.train.restarts import KILL_ENV

    run_dir = rewind(reference, tmp_path / "grow", 3)
    proc = launch(2, *train_args(run_dir, data_cache, "parallel.zero_stage=2"), options=("--max-restarts", "1"),
                  env={KILL_ENV: "1:4"})
    assert proc.stdout.count("resumed from step_00000003 at step 3 (written by another number of ranks; now 2)") == 2
    assert "restart 1 of 1: rank 1 was killed by SIGKILL; every rank starts again" in proc.stdout
    assert "restart 1 after rank 1 was killed by SIGKILL: resuming from step_00000003" in proc.stdout
    restarts = [json.loads(line) for line in (run_dir / "restarts.jsonl").read_text().splitlines()]
    assert [(r["restart"], r["rank"], r["how"]) for r in restarts] == [(1, 1, "was killed by SIGKILL")]
    assert all(json.loads(line)["restarts"] == 1 for line in (run_dir / "metrics.jsonl").read_text().splitlines()[3:])
    assert_continues(run_dir, reference)
    assert len(list((run_dir / "launch").glob("*/config.yaml"))) == 1  # started from its snapshot
    # both ranks ran: the data-parallel token count is 2 ranks x batch x seq_len per step
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["tokens"] == STEPS * 2 * 2 * 64
    assert not list((run_dir / "checkpoints").glob(".tmp-*")), "the universal copy is removed after loading"
    assert saved_layout(resolve_checkpoint(run_dir)) == Layout(world_size=2, sp=1, zero_stage=2)


# each ZeRO stage on 2 data-parallel ranks against one rank accumulating their 2 micro-batches:
# stage 2 growing (above), stages 1 and 3 shrinking (ZeRO-3 needs `repair_zero3_universal_load`:
# without it step 6 is off by 4e-4)
@pytest.mark.parametrize("zero_stage", [1, 3])
def test_two_rank_zero_run_resumes_on_one(reference, two_rank_zero3_stopped_at_3, tmp_path, data_cache, zero_stage):
    if zero_stage == 3:  # the shared run (the export tests merge its partitions)
        run_dir = rewind(two_rank_zero3_stopped_at_3, tmp_path / "shrink3", 3)
    else:
        run_dir = tmp_path / f"shrink{zero_stage}"
        torchrun(2, *train_args(run_dir, data_cache, f"parallel.zero_stage={zero_stage}", "train.stop_at_step=3"))
    # mosaicml-streaming is elastically deterministic: a global batch of 2 micro-batches holds the
    # same samples whether one rank reads both or two ranks read one each, so the runs see the same
    # data and 2 data-parallel ranks equal one rank accumulating their 2 micro-batches
    assert_close(losses(run_dir), losses(reference), steps=range(1, 4))
    # the gradient reduction is timed where one call holds all of it (ZeRO 0 and 1), on several ranks only
    for record in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()):
        assert "collectives_share" not in record  # no sequence parallelism
        assert (0 < record["grad_reduce_share"] < 1) if zero_stage == 1 else "grad_reduce_share" not in record
    proc = run_fsf(*train_args(run_dir, data_cache, f"parallel.zero_stage={zero_stage}", *ONE_RANK))
    assert "resumed from step_00000003 at step 3 (written by another number of ranks; now 1)" in proc.stdout
    assert_continues(run_dir, reference)


def test_another_sequence_parallel_size_or_zero_stage_is_refused_naming_both(reference):
    ckpt = reference / "checkpoints" / "step_00000003"
    saved = saved_layout(ckpt)
    assert saved == Layout(world_size=1, sp=1, zero_stage=2)
    check_resume_layout(ckpt, saved, Layout(world_size=4, sp=1, zero_stage=2))  # another data-parallel size is fine
    with pytest.raises(CheckpointError, match=r"parallel\.sp=1 in the checkpoint, 2 in this run"):
        check_resume_layout(ckpt, saved, Layout(world_size=2, sp=2, zero_stage=2))
    with pytest.raises(CheckpointError, match=r"parallel\.zero_stage=2 in the checkpoint, 3 in this run"):
        check_resume_layout(ckpt, saved, Layout(world_size=1, sp=1, zero_stage=3))

