"""Validation with a mixture of streams (`data.streams`) reads every stream's held-out split: each
stream's loss is logged (`val/loss/<stream>`) and `val/loss` weighs them as the training mix."""

import json

import numpy as np
import pytest

from fsframework.config import load_config
from fsframework.eval.perplexity import heldout_tokens
from fsframework.train.validation import mixture_weights, stream_labels, validation_sets
from tests.data.test_heldout import QUICKSTART, TINY, write_docs
from tests.utils import run_fsf


@pytest.fixture(scope="module")
def streams(tmp_path_factory):
    """Two datasets built by `fsf data build` with held-out splits: prose, and digits (another
    distribution, so their losses differ), the prose one three times the size."""
    root = tmp_path_factory.mktemp("streams")
    digits = root / "digits.jsonl"
    digits.write_text("".join(json.dumps({"text": " ".join(str(i * j % 97) for j in range(40))}) + "\n"
                              for i in range(40)))
    for name, docs in (("prose", write_docs(root / "prose.jsonl")), ("digits", digits)):
        run_fsf("data", "build", str(docs), "--out", str(root / name), "--seq-len", "32", "--eval-fraction", "0.2")
    return root


def _config(streams, *mixture):
    return load_config(QUICKSTART, [f"data.streams=[{', '.join(mixture)}]", *TINY, "train.eval_batches=1"])


def test_every_stream_gives_its_own_held_out_windows(streams):
    cfg = _config(streams, f"{{source: {streams / 'prose'}}}", f"{{source: {streams / 'digits'}}}")
    sets = validation_sets(cfg)
    assert [s.label for s in sets] == ["prose", "digits"]
    for held_out, name in zip(sets, ("prose", "digits")):
        own = heldout_tokens(str(streams / name / "eval"), held_out.windows.numel())
        assert held_out.windows.shape == (2, 33)
        assert np.array_equal(held_out.windows.flatten().numpy(), own[:66])
    # no proportions: weighted by the size of each training split, as the mixture draws
    samples = [sum(s["samples"] for s in json.loads((streams / n / "train" / "index.json").read_text())["shards"])
               for n in ("prose", "digits")]
    assert [s.weight for s in sets] == pytest.approx([samples[0] / sum(samples), samples[1] / sum(samples)])
    assert mixture_weights(_config(streams, f"{{source: {streams / 'prose'}, proportion: 3}}",
                                   f"{{source: {streams / 'digits'}, proportion: 1}}")) == [0.75, 0.25]
    same_name = _config(streams, f"{{source: {streams / 'prose'}}}", f"{{source: {streams / 'x' / 'prose'}}}")
    assert stream_labels(same_name) == ["0-prose", "1-prose"]


def test_training_logs_each_streams_validation_loss_and_their_mix(streams, tmp_path):
    run = tmp_path / "run"
    mixture = (f"data.streams=[{{source: {streams / 'prose'}, proportion: 3}}, "
               f"{{source: {streams / 'digits'}, proportion: 1}}]")
    proc = run_fsf("train", QUICKSTART, f"run_dir={run}", mixture, *TINY, "train.max_steps=2", "train.eval_every=2",
                   "train.eval_batches=1")
    record = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    prose, digits = record["val/loss/prose"], record["val/loss/digits"]
    assert abs(prose - digits) > 1e-3  # two distributions, read apart
    assert record["val/loss"] == pytest.approx(0.75 * prose + 0.25 * digits, rel=1e-6)
    assert f"per stream: prose {prose:.4f}, digits {digits:.4f}" in proc.stdout


def test_a_stream_without_held_out_split_is_named_before_any_work(streams, tmp_path):
    run_fsf("data", "build", str(streams / "digits.jsonl"), "--out", str(tmp_path / "no_eval"), "--seq-len", "32")
    run = tmp_path / "run"
    mixture = f"data.streams=[{{source: {streams / 'prose'}}}, {{source: {tmp_path / 'no_eval'}}}]"
    proc = run_fsf("train", QUICKSTART, f"run_dir={run}", mixture, *TINY, "train.max_steps=2", "train.eval_every=1",
                   check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert str(tmp_path / "no_eval") in proc.stderr and "--eval-fraction" in proc.stderr
    assert not run.exists()
