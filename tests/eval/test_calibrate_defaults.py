"""`fsf calibrate RUN` with its defaults on a small run (the README's command on the quickstart):
the windows fit the held-out text it has instead of asking for 64 of 4096 tokens."""

import json

import numpy as np

from fsframework.checkpoints import resolve_checkpoint
from fsframework.eval.calibrate import default_windows
from tests.eval.test_fsb_chain import FS_TINY
from tests.utils import REPO, TINY_DATA, run_fsf


def test_defaults_fit_the_text():
    assert default_windows(np.zeros(10**6), None, None, 512) == (64, 4096)
    assert default_windows(np.zeros(20 * 4096), None, None, 512) == (20, 4096)
    assert default_windows(np.zeros(3000), None, None, 512) == (5, 512)  # no 4096-token window: the run's length
    assert default_windows(np.zeros(3000), 7, 100, 512) == (7, 100)  # given values are kept (and checked later)


def test_calibrate_a_small_run_with_the_defaults(tmp_path, data_cache):
    run = tmp_path / "fs"
    run_fsf("train", str(REPO / "yamls/quickstart.yaml"), f"run_dir={run}", "model.name=fs", "train.max_steps=1",
            "train.ckpt_every=1", f"data.cache_dir={data_cache}", *TINY_DATA, *FS_TINY)
    run_fsf("calibrate", str(run))
    record = json.loads((resolve_checkpoint(run) / "calibration.json").read_text())
    assert record["windows"] >= 1 and record["seq_len"] in (64, 4096)
    assert record["cells"] == record["windows"] * record["seq_len"] // 4


def test_calibrate_a_recall_run_on_recall_rows(tmp_path):
    """A run on `data.source=mqar` has no held-out text: it is calibrated on recall rows of its sizes
    (as many as asked, of its training length), and FS-B then reads its checkpoint."""
    run = tmp_path / "fs-mqar"
    run_fsf("train", str(REPO / "yamls/mqar-cpu.yaml"), f"run_dir={run}", "data.seq_len=64", "data.micro_batch_size=2",
            "data.mqar.pairs=4", "data.mqar.queries=4", "data.warmup.steps=0", "train.max_steps=1", "train.ckpt_every=1",
            "train.progress=false", "train.tensorboard=false")
    run_fsf("calibrate", str(run), "--windows", "3")
    record = json.loads((resolve_checkpoint(run) / "calibration.json").read_text())
    assert (record["data"], record["windows"], record["seq_len"]) == ("mqar", 3, 64)
    assert record["cells"] == 3 * 64 // 8 and len(record["tau"]) == 2
    out = run_fsf("eval", str(run), "model.name=fsb", "--tasks", "mqar", "--lengths", "64", "--num-samples", "2")
    assert "mqar_floor" in out.stdout
