"""Exports of trained runs: a ZeRO-3 run (the two-rank run the resize tests share) and a ZeRO-0
run of the same weights export to the same tensors, `train.init_from`, `fsf calibrate` and `fsf eval` take an export, and the export
evaluated from another directory scores the run's perplexity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fsframework.checkpoints import resolve_checkpoint
from fsframework.export import export_checkpoint
from tests.utils import REPO, TINY_DATA, TINY_MODEL, run_fsf

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(300)]
# one step at a learning rate far below the fp32 resolution of any weight (Adam moves each one by
# about the learning rate): the ZeRO-0 run started from the ZeRO-3 run's export keeps its weights,
# so both runs hold the same weights and their exports must be equal bit for bit
ONE_STEP = [*TINY_DATA, *TINY_MODEL, "model.name=fs", "model.attention.block_size=16", "train.max_steps=1",
            "train.ckpt_every=1", "optim.lr=1e-30", "optim.warmup_steps=0", "train.progress=false",
            "train.tensorboard=false"]


@pytest.fixture(scope="module")
def runs(two_rank_zero3_stopped_at_3, tmp_path_factory, data_cache) -> dict[str, Path]:
    """A ZeRO-3 run on 2 data-parallel ranks (each holds half of every tensor), its export, and a
    1-rank ZeRO-0 run started from that export, with its export."""
    root = tmp_path_factory.mktemp("export_runs")
    zero3 = two_rank_zero3_stopped_at_3  # read only: the exports and the new run are written elsewhere
    export_checkpoint(zero3, root / "zero3_export")
    proc = run_fsf("train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={root / 'zero0'}",
                   f"data.cache_dir={data_cache}", *ONE_STEP, "parallel.zero_stage=0",
                   f"train.init_from={root / 'zero3_export'}")
    assert "initialised weights from" in proc.stdout
    export_checkpoint(root / "zero0", root / "zero0_export")
    return {"zero3": zero3, **{name: root / name for name in ("zero3_export", "zero0", "zero0_export")}}


def test_zero3_and_zero0_runs_of_the_same_weights_export_equal(runs):
    ds = resolve_checkpoint(runs["zero3"]) / "ds"
    assert len(list(ds.glob("zero_pp_rank_*_optim_states.pt"))) == 2  # the export merged two partitions
    a, b = (load_file(runs[name] / "model.safetensors") for name in ("zero3_export", "zero0_export"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_export_evaluated_from_another_directory_scores_the_runs_perplexity(runs, tmp_path, monkeypatch):
    from fsframework.eval.runner import evaluate_checkpoint

    def perplexity(checkpoint: Path, out: Path) -> dict:
        evaluate_checkpoint(checkpoint, tasks=["perplexity"], lengths=[64], num_samples=2, batch_size=1, seed=0,
                            out=out, overrides=[])
        return json.loads(out.read_text())["scores"]["perplexity"]

    of_run = perplexity(runs["zero0"], tmp_path / "run.json")
    monkeypatch.chdir(tmp_path)  # the export names its data with absolute paths
    of_export = perplexity(runs["zero0_export"], tmp_path / "export.json")
    assert of_export == of_run and 1.0 < of_run["64"]


def test_calibrate_takes_an_export(runs):
    from fsframework.checkpoints import load_model
    from fsframework.eval.calibrate import calibrate

    record = calibrate(runs["zero3_export"], windows=2, seq_len=32, progress=False)
    assert Path(record["file"]) == runs["zero3_export"] / "calibration.json"
    model, _ = load_model(runs["zero3_export"], overrides=["model.name=fsb"])
    assert model.fsb_calibration_file == record["file"]
