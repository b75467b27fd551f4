"""The induction warm-up (`data.warmup.*`): rows tiling one passage of a per-row length, the loss on
exactly the tokens the repetition predicts, served before the run's own source, resumed exactly."""

from __future__ import annotations

import json

import pytest
import torch

from fsframework.config import ConfigError, WarmupConfig, load_config
from fsframework.data.warmups import induction_batch, induction_rows
from tests.utils import REPO, TINY_MODEL, run_fsf


def test_rows_tile_one_passage_and_mark_exactly_the_repeated_targets():
    tokens, predictable = induction_rows(torch.Generator().manual_seed(0), 200, 63, draw=50, min_passage=3,
                                         max_passage=20)
    assert tokens.shape == (200, 64) and predictable.shape == (200, 63)
    assert int(tokens.min()) >= 0 and int(tokens.max()) < 50
    lengths = []
    for row, marks in zip(tokens.tolist(), predictable.tolist()):
        n = marks.index(True) + 1  # the first predictable target is token n, the passage's first repeat
        lengths.append(n)
        assert 3 <= n <= 20
        assert all(row[j] == row[j - n] for j in range(n, 64))  # the passage, tiled
        assert marks == [j + 1 >= n for j in range(63)]  # exactly the tokens of the repetitions
    assert len(set(lengths)) >= 15, "the passage length is drawn per row"


def test_batches_score_only_the_predictable_targets_and_are_seeded():
    warmup = WarmupConfig(steps=5, min_passage=4, max_passage=16, draw=0)
    batch = induction_batch(warmup, 40, rows=6, targets=48, seed=0, step=2, micro=0, rank=0)
    inputs, targets = batch["inputs"], batch["targets"]
    assert inputs.shape == targets.shape == (6, 48) and int(inputs.max()) < 40  # draw 0: the whole vocabulary
    scored = targets != -100
    for b in range(6):
        first = int(scored[b].nonzero()[0])
        n = first + 1
        assert not bool(scored[b, :first].any()) and bool(scored[b, first:].all())
        assert torch.equal(targets[b, first:], inputs[b, first + 1 - n:48 - n + 1])  # each is the token n back
    again = induction_batch(warmup, 40, rows=6, targets=48, seed=0, step=2, micro=0, rank=0)
    assert torch.equal(again["inputs"], inputs)
    for other in ((0, 3, 0, 0), (0, 2, 1, 0), (0, 2, 0, 1), (1, 2, 0, 0)):
        seed, step, micro, rank = other
        assert not torch.equal(induction_batch(warmup, 40, 6, 48, seed, step, micro, rank)["inputs"], inputs)


@pytest.mark.parametrize("overrides, message", [
    (["data.warmup.min_passage=1"], "2 <= min_passage <= max_passage"),
    (["data.warmup.min_passage=40", "data.warmup.max_passage=30"], "2 <= min_passage"),
    (["data.warmup.max_passage=65"], "more than half of data.seq_len=128"),
    (["data.warmup.draw=1000"], "exceeds model.vocab_size=260"),
    (["data.warmup.steps=-1"], "data.warmup.steps"),
])
def test_bad_warmup_settings_are_named(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(REPO / "yamls/mqar-cpu.yaml", ["data.warmup.steps=5", *overrides])


def test_the_warmup_comes_first_logs_its_copy_loss_and_resumes_exactly(tmp_path):
    common = ["data.source=mqar", "data.seq_len=64", "data.micro_batch_size=2", "data.mqar.pairs=4",
              "data.mqar.queries=4", *TINY_MODEL, "model.name=tfpp", "train.max_steps=4", "data.warmup.steps=2",
              "data.warmup.max_passage=16", "optim.warmup_steps=1", "train.log_every=1", "train.progress=false"]
    whole, split = tmp_path / "whole", tmp_path / "split"
    run_fsf("train", str(REPO / "yamls/mqar-cpu.yaml"), f"run_dir={whole}", "train.ckpt_every=4", *common)
    # stopped inside the warm-up and resumed: the warm-up batches and the recall rows line up again
    run_fsf("train", str(REPO / "yamls/mqar-cpu.yaml"), f"run_dir={split}", "train.ckpt_every=1",
            "train.stop_at_step=1", "train.tensorboard=false", *common)
    run_fsf("train", str(REPO / "yamls/mqar-cpu.yaml"), f"run_dir={split}", "train.ckpt_every=1",
            "train.tensorboard=false", *common)
    records = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    assert [r["warmup"] for r in records] == [1, 1, 0, 0]
    assert [r.get("warmup/copy_loss") for r in records[:2]] == [r["loss"] for r in records[:2]]
    assert "warmup/copy_loss" not in records[2] and "loss_alias" not in records[0]
    resumed = {r["step"]: r["loss"] for r in map(json.loads, (split / "metrics.jsonl").read_text().splitlines())}
    assert [resumed[r["step"]] for r in records] == pytest.approx([r["loss"] for r in records], rel=1e-6)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(whole / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("warmup/copy_loss")] == [1, 2]
