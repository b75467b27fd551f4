"""Sequence-length warmup: the first steps train on samples cut into shorter sequences."""

from __future__ import annotations

import json

import pytest
import torch

from fsframework.config import ConfigError, load_config
from fsframework.train.trainer import cut_sequences
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
