"""The FS-B chain at CPU size (docs/freesolo.md §1.8): train FS, `fsf calibrate`, `fsf eval model.name=fsb`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fsframework.checkpoints import resolve_checkpoint
from fsframework.cli import app
from tests.parallel.ranks import run_ranks
from tests.utils import REPO, TINY_DATA, run_fsf

FS_TINY = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.attention.cell_size=4",
           "model.attention.block_size=8", "model.attention.window=8", "model.attention.top_k=2",
           "train.progress=false", "train.tensorboard=false", "optim.warmup_steps=2"]


def test_train_fs_calibrate_then_read_with_fsb(tmp_path, data_cache):
    run = tmp_path / "fs"
    run_fsf("train", str(REPO / "yamls/quickstart.yaml"), f"run_dir={run}", "model.name=fs", "train.max_steps=3",
            "train.ckpt_every=3", f"data.cache_dir={data_cache}", *TINY_DATA, *FS_TINY)
    ckpt = resolve_checkpoint(run)
    cli = CliRunner()
    scores = tmp_path / "scores.json"
    evaluate = ["eval", str(run), "--tasks", "perplexity", "--lengths", "64", "--num-samples", "2", "--out", str(scores),
                "model.name=fsb", "model.attention.fsb.beam_width=4"]

    res = cli.invoke(app, evaluate)  # no calibration yet
    assert res.exit_code == 2 and "fsf calibrate" in res.output

    calibrate = ["calibrate", str(run), "--windows", "6", "--seq-len", "48", "--seed", "3"]
    res = cli.invoke(app, calibrate)
    assert res.exit_code == 0, res.output
    record = json.loads((ckpt / "calibration.json").read_text())
    assert len(record["tau"]) == 2 and all(len(row) == 2 for row in record["tau"])
    assert record["cells"] == 6 * 48 // 4 and (record["windows"], record["seq_len"], record["seed"]) == (6, 48, 3)
    assert (ckpt / "calibration.png").stat().st_size > 0
    assert cli.invoke(app, calibrate).exit_code == 0  # deterministic: the same arguments give the same numbers
    assert json.loads((ckpt / "calibration.json").read_text())["tau"] == record["tau"]
    assert cli.invoke(app, [*calibrate[:-1], "4"]).exit_code == 0  # another shuffle, other windows
    assert json.loads((ckpt / "calibration.json").read_text())["tau"] != record["tau"]

    res = cli.invoke(app, evaluate)
    assert res.exit_code == 0, res.output
    meta = json.loads(scores.read_text())["meta"]
    assert meta["read_path"] == {"model": "fsb", "top_k": 4, "beam_width": 4, "bound_c": 8.0, "forests": "both",
                                 "tau_file": str(ckpt / "calibration.json")}
    assert json.loads(scores.read_text())["scores"]["perplexity"]["64"] > 1

    # a calibration of another model size, and bad calibration arguments, are refused
    (ckpt / "calibration.json").write_text(json.dumps({**record, "tau": record["tau"] * 2}))
    res = cli.invoke(app, evaluate)
    assert res.exit_code == 2 and "tau must be 2 layers x 2 heads" in res.output
    res = cli.invoke(app, [*evaluate, "model.attention.fsb.beam_width=2", "model.attention.fsb.top_k=3"])
    assert res.exit_code == 2 and "fsb.beam_width=2 must be >= model.attention.fsb.top_k=3" in res.output
    res = cli.invoke(app, ["calibrate", str(run), "--windows", "100000", "--seq-len", "48"])
    assert res.exit_code == 2 and "lower --windows" in res.output


@pytest.mark.ranks
def test_two_ranks_calibrate_to_the_same_medians(tmp_path, one_rank_two_micro_batches):
    # two ranks (torchrun) split the windows 3 + 3 and gather every value: the same exact medians as
    # one process, on a copy of the shared FS run (the multi-rank tests' own, so no extra training)
    run = tmp_path / "fs"
    shutil.copytree(one_rank_two_micro_batches, run)
    calibrate = ["calibrate", str(run), "--windows", "6", "--seq-len", "48", "--seed", "3"]
    res = CliRunner().invoke(app, calibrate)
    assert res.exit_code == 0, res.output
    record_file = resolve_checkpoint(run) / "calibration.json"
    one_process = json.loads(record_file.read_text())["tau"]
    record_file.unlink()
    run_ranks(Path(__file__).with_name("_calibrate_worker.py"), 2, str(run), "6", "48", "3")
    assert json.loads(record_file.read_text())["tau"] == one_process
