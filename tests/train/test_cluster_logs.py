"""Logs a cluster job can read while it runs: with stdout not a terminal (as under SLURM, nohup or
CI, and in these tests), a plain line per logging interval, checkpoint and validation, and a final
summary, whatever `train.progress` says; no line is wrapped."""

import re
from pathlib import Path

import pytest

from fsframework.config import load_config
from fsframework.data.loader import embedded_corpus_location

from tests.utils import REPO, TINY_DATA, TINY_MODEL, run_fsf


@pytest.mark.parametrize("progress", ["true", "false"])
def test_plain_lines_per_interval_checkpoint_validation_and_end(tmp_path, data_cache, progress):
    run = tmp_path / ("a_directory_name_long_enough_that_an_80_column_wrap_would_split_the_path_" + "x" * 40)
    proc = run_fsf("train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={run}", f"data.cache_dir={data_cache}",
                   *TINY_DATA, *TINY_MODEL, "model.name=tfpp", "train.max_steps=4", "train.log_every=2",
                   "train.ckpt_every=2", "train.eval_every=2", "train.eval_batches=1", f"train.progress={progress}",
                   "train.tensorboard=false")
    lines = proc.stdout.splitlines()
    # the corpus's directory under data.cache_dir, keyed by its settings, as every reader finds it
    cfg = load_config(REPO / "yamls" / "quickstart.yaml", [f"data.cache_dir={data_cache}", *TINY_DATA])
    corpus = embedded_corpus_location(cfg)
    assert f"embedded corpus: {corpus}" in lines and corpus.parent == Path(data_cache), proc.stdout
    assert (corpus / "train" / "index.json").is_file()
    steps = [line for line in lines if line.startswith("step ")]
    assert len(steps) == 2, proc.stdout
    assert re.fullmatch(r"step 2/4  loss \d+\.\d{4}  lr \S+  tokens/s [\d,]+  TFLOP/s \S+  rss [\d,]+ MB  "
                        r"data \d+%  ETA \d+:\d\d:\d\d", steps[0]), steps
    assert steps[1].startswith("step 4/4 ")
    assert [line for line in lines if line.startswith("checkpoint at step")] == [
        f"checkpoint at step 2: {run / 'checkpoints' / 'step_00000002'}",
        f"checkpoint at step 4: {run / 'checkpoints' / 'step_00000004'}"]
    assert sum(line.startswith("validation at step ") and "perplexity" in line for line in lines) == 2
    assert lines[-1].startswith("finished at step 4/4, ") and lines[-1].endswith(str(run / "checkpoints" / "step_00000004"))
