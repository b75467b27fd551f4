"""`train.loss_chunk`: training and validation through the model's own scoring, the output head in
chunks, follow the whole-logits run step for step."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tests.utils import REPO, TINY_DATA, TINY_MODEL, run_fsf


def metrics(run_dir: Path, data_cache: str, *extra: str) -> list[dict]:
    run_fsf("train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={run_dir}", f"data.cache_dir={data_cache}",
            *TINY_DATA, *TINY_MODEL, "model.name=fsl", "train.max_steps=4", "train.eval_every=2",
            "train.eval_batches=2", "optim.warmup_steps=1", "train.progress=false", "train.tensorboard=false",
            *extra)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_chunked_head_trains_and_validates_as_the_whole_logits(tmp_path, data_cache):
    # micro-batches of 2 x 64 positions in chunks of 24: five full chunks and a ragged one
    whole = metrics(tmp_path / "whole", data_cache)
    chunked = metrics(tmp_path / "chunked", data_cache, "train.loss_chunk=24")
    assert len(whole) == len(chunked) == 4
    for a, b in zip(whole, chunked):
        assert math.isclose(a["loss"], b["loss"], rel_tol=1e-5), (a, b)
    validated = [(a["val/loss"], b["val/loss"]) for a, b in zip(whole, chunked) if "val/loss" in a]
    assert len(validated) == 2 and all(math.isclose(a, b, rel_tol=1e-5) for a, b in validated)
