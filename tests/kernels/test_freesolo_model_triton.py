"""The FreeSolo models train through the trainer with `model.attention.impl=triton`
(the interpreter on CPU) and their losses match the reference path step by step: two steps, so
the second loss is that of weights the kernels' backward pass updated."""

from __future__ import annotations

import json

import pytest

from tests.utils import REPO, TINY_DATA, run_fsf

FS_TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.attention.cell_size=4",
           "model.attention.block_size=8", "model.attention.window=8", "model.attention.top_k=2",
           "model.attention.retained_cells=3", "model.attention.recent_cells=1"]


def _losses(run_dir) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("variant", ["fs", "fsl"])
def test_triton_path_trains_like_the_reference(variant, tmp_path, data_cache):
    losses = {}
    for impl in ("reference", "triton"):
        run_dir = tmp_path / impl
        run_fsf("train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={run_dir}",
                f"data.cache_dir={data_cache}", *TINY_DATA, *FS_TINY, f"model.name={variant}",
                f"model.attention.impl={impl}", "train.max_steps=2", "train.ckpt_every=2", "train.progress=false",
                # 32 tokens: 4 blocks of 8, cells routed over 3 earlier blocks; the interpreter's time
                # grows with the kernels' programs, which the kernel tests cover at every shape
                "data.seq_len=32", "data.micro_batch_size=1",
                "train.tensorboard=false")  # in this process: the kernels run as tests/kernels/conftest.py set
        losses[impl] = _losses(run_dir)
    assert len(losses["triton"]) == 2
    assert losses["triton"] == pytest.approx(losses["reference"], rel=1e-4)
