"""Sequence-length warmup: the first steps train on samples cut into shorter sequences."""

from __future__ import annotations

import json

import pytest
import torch

from fsframework.config import ConfigError, load_config
from fsframework.data.sources import cut_sequences
from tests.utils import REPO, TINY_DATA, TINY_MODEL, run_fsf


def test_cut_sequences_keeps_every_token_in_order():
    batch = {"inputs": torch.arange(16).view(2, 8), "targets": torch.arange(16).view(2, 8) + 1,
             "weights": torch.ones(2, 8), "doc_count": torch.tensor([3, 1])}
    cut = cut_sequences(batch, 4)
    assert cut["inputs"].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert torch.equal(cut["targets"], cut["inputs"] + 1) and cut["weights"].shape == (4, 4)
    assert torch.equal(cut["doc_count"], batch["doc_count"])  # not a [B, T] tensor: left alone


@pytest.mark.parametrize("overrides, message", [
    (["data.seq_len=64", "train.short_seq_len=24", "train.short_seq_steps=5"], "must divide data.seq_len=64"),
    (["data.seq_len=64", "train.short_seq_len=64", "train.short_seq_steps=5"], "shorter than it"),
    (["train.short_seq_len=128", "train.short_seq_steps=5", "parallel.sp=2"], "parallel.sp=1"),
    (["model.name=fs", "model.attention.block_size=128", "model.attention.cell_size=32",
      "train.short_seq_len=64", "train.short_seq_steps=5"], "multiple of model.attention.block_size=128"),
    (["train.short_seq_len=-4"], "train.short_seq_len"),
])
def test_bad_warmup_settings_are_named(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(REPO / "yamls/quickstart.yaml", overrides)


def test_training_records_the_warmup_length(tmp_path, data_cache):
    run = tmp_path / "run"
    run_fsf("train", str(REPO / "yamls/quickstart.yaml"), f"run_dir={run}", f"data.cache_dir={data_cache}",
            *TINY_DATA, *TINY_MODEL, "model.name=tfpp", "train.max_steps=3", "train.ckpt_every=3",
            "train.short_seq_len=16", "train.short_seq_steps=2", "train.progress=false", "train.tensorboard=false")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["seq_len"] for r in records] == [16, 16, 64]
    assert all(r["loss"] == r["loss"] for r in records)  # finite, not NaN


# copy warmup: generated repeated passages before the data stream starts

def test_copy_warmup_batches_fill_a_micro_batch_and_are_reproducible():
    from fsframework.data.copy_warmup import copy_warmup_batch

    cfg = load_config(REPO / "yamls/quickstart.yaml", ["model.name=tfpp", "data.seq_len=64", "data.micro_batch_size=2",
                                                         "research.copy_warmup_steps=4", "research.copy_warmup_seq_len=32"])
    batch = copy_warmup_batch(cfg, step=3, micro=0, rank=0)
    assert batch["inputs"].shape == batch["targets"].shape == (4, 32)
    assert torch.equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
    assert int(batch["inputs"].max()) < cfg.research.copy_warmup_draw
    again = copy_warmup_batch(cfg, step=3, micro=0, rank=0)
    assert torch.equal(batch["inputs"], again["inputs"])
    for other in (copy_warmup_batch(cfg, 4, 0, 0), copy_warmup_batch(cfg, 3, 1, 0), copy_warmup_batch(cfg, 3, 0, 1)):
        assert not torch.equal(batch["inputs"], other["inputs"])


@pytest.mark.parametrize("overrides, message", [
    (["data.seq_len=64", "data.micro_batch_size=1", "research.copy_warmup_seq_len=48"], "must divide the tokens"),
    (["research.copy_warmup_seq_len=32", "research.copy_warmup_max_passage=17"], "half of"),
    (["research.copy_warmup_draw=100000"], "exceeds model.vocab_size"),
    (["parallel.sp=2"], "parallel.sp=1"),
    (["model.name=fs", "model.attention.block_size=64", "model.attention.cell_size=16",
      "research.copy_warmup_seq_len=32"], "multiple of model.attention.block_size=64"),
])
def test_bad_copy_warmup_settings_are_named(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(REPO / "yamls/quickstart.yaml", ["research.copy_warmup_steps=5", *overrides])


def test_copy_warmup_comes_first_and_resumes_exactly(tmp_path, data_cache):
    common = [f"data.cache_dir={data_cache}", *TINY_DATA, *TINY_MODEL, "model.name=tfpp", "train.max_steps=4",
              "research.copy_warmup_steps=2", "research.copy_warmup_seq_len=32",
              "research.copy_warmup_max_passage=8", "research.copy_warmup_draw=200", "train.progress=false", "train.tensorboard=false"]
    whole, split = tmp_path / "whole", tmp_path / "split"
    run_fsf("train", str(REPO / "yamls/quickstart.yaml"), f"run_dir={whole}", "train.ckpt_every=4", *common)
    # stopped inside the warmup and resumed: the warmup batches and the data stream line up again
    run_fsf("train", str(REPO / "yamls/quickstart.yaml"), f"run_dir={split}", "train.ckpt_every=1",
            "train.stop_at_step=1", *common)
    run_fsf("train", str(REPO / "yamls/quickstart.yaml"), f"run_dir={split}", "train.ckpt_every=1", *common)
    records = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    assert [r["copy_warmup"] for r in records] == [1, 1, 0, 0]
    assert [r["seq_len"] for r in records] == [32, 32, 64, 64]
    resumed = {r["step"]: r["loss"] for r in map(json.loads, (split / "metrics.jsonl").read_text().splitlines())}
    assert [resumed[r["step"]] for r in records] == pytest.approx([r["loss"] for r in records], rel=1e-6)
