"""A mixture of streams (`data.streams`): validation, `fsf eval` perplexity and `fsf calibrate` read
every stream's held-out split. Each stream's loss is logged (`val/loss/<stream>`) and `val/loss`
weighs them as the training mix; perplexity is scored per stream and for the mixture; calibration
windows are drawn from every stream by its share."""

import json
import math

import numpy as np
import pytest
import torch

from fsframework.config import load_config
from fsframework.eval.perplexity import heldout_tokens
from fsframework.data.mixture import mixture_weights, stream_labels
from fsframework.train.validation import validation_sets
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
    cfg = _config(streams, f"{{path: {streams / 'prose'}}}", f"{{path: {streams / 'digits'}}}")
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
    assert mixture_weights(_config(streams, f"{{path: {streams / 'prose'}, proportion: 3}}",
                                   f"{{path: {streams / 'digits'}, proportion: 1}}")) == [0.75, 0.25]
    same_name = _config(streams, f"{{path: {streams / 'prose'}}}", f"{{path: {streams / 'x' / 'prose'}}}")
    assert stream_labels(same_name) == ["0-prose", "1-prose"]


def test_training_logs_each_streams_validation_loss_and_their_mix(streams, tmp_path):
    run = tmp_path / "run"
    mixture = (f"data.streams=[{{path: {streams / 'prose'}, proportion: 3}}, "
               f"{{path: {streams / 'digits'}, proportion: 1}}]")
    proc = run_fsf("train", QUICKSTART, f"run_dir={run}", mixture, *TINY, "train.max_steps=2", "train.eval_every=2",
                   "train.eval_batches=1")
    record = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    prose, digits = record["val/loss/prose"], record["val/loss/digits"]
    assert abs(prose - digits) > 1e-3  # two distributions, read apart
    assert record["val/loss"] == pytest.approx(0.75 * prose + 0.25 * digits, rel=1e-6)
    assert f"per stream: prose {prose:.4f}, digits {digits:.4f}" in proc.stdout


def test_a_stream_without_held_out_split_is_named_before_any_work(streams, tmp_path):
    run_fsf("data", "build", str(streams / "digits.jsonl"), "--out", str(tmp_path / "no_eval"), "--seq-len", "32",
            "--eval-fraction", "0")
    run = tmp_path / "run"
    mixture = f"data.streams=[{{path: {streams / 'prose'}}}, {{path: {tmp_path / 'no_eval'}}}]"
    proc = run_fsf("train", QUICKSTART, f"run_dir={run}", mixture, *TINY, "train.max_steps=2", "train.eval_every=1",
                   check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert str(tmp_path / "no_eval") in proc.stderr and "--eval-fraction" in proc.stderr
    assert not run.exists()


# `fsf eval` perplexity and `fsf calibrate` read every stream's held-out split too
FS = ["model.name=fs", "model.attention.cell_size=4", "model.attention.block_size=8", "model.attention.window=8",
      "model.attention.top_k=2", "train.max_steps=1"]


def _mixture(streams, *names_and_proportions) -> str:
    return "data.streams=[" + ", ".join(f"{{path: {streams / name}, proportion: {p}}}"
                                        for name, p in names_and_proportions) + "]"


def test_eval_scores_every_streams_perplexity_and_their_mixture(streams, tmp_path):
    run = tmp_path / "run"
    run_fsf("train", QUICKSTART, f"run_dir={run}", _mixture(streams, ("prose", 3), ("digits", 1)), *TINY,
            "train.max_steps=2")
    scores = tmp_path / "scores.json"
    evaluate = ["eval", str(run), "--tasks", "perplexity", "--lengths", "16,32", "--num-samples", "2"]
    proc = run_fsf(*evaluate, "--out", str(scores))
    result = json.loads(scores.read_text())
    mixture, by_stream = result["scores"]["perplexity"], result["breakdown"]["perplexity"]
    assert set(by_stream) == {"prose", "digits"} and "prose" in proc.stdout
    for length in ("16", "32"):
        prose, digits = by_stream["prose"][length], by_stream["digits"][length]
        assert abs(prose - digits) > 1e-3
        assert mixture[length] == pytest.approx(math.exp(0.75 * math.log(prose) + 0.25 * math.log(digits)), rel=1e-12)
    # each stream's value is what an evaluation of that stream alone scores
    alone = tmp_path / "alone.json"
    run_fsf(*evaluate, "--out", str(alone), _mixture(streams, ("digits", 1)))
    assert json.loads(alone.read_text())["scores"]["perplexity"] == by_stream["digits"]


def test_calibration_windows_come_from_every_stream(streams, tmp_path):
    run = tmp_path / "fs"
    run_fsf("train", QUICKSTART, f"run_dir={run}", _mixture(streams, ("prose", 3), ("digits", 1)), *TINY, *FS)
    proc = run_fsf("calibrate", str(run), "--windows", "4", "--seq-len", "16")
    record = json.loads((run / "checkpoints" / "step_00000001" / "calibration.json").read_text())
    assert record["data"] == [str(streams / "prose" / "eval"), str(streams / "digits" / "eval")], proc.stdout
    assert (record["windows"], record["cells"]) == (4, 4 * 16 // 4)


def test_mixture_windows_share_the_count_by_weight():
    from fsframework.eval.calibrate import apportion, calibration_windows, default_windows, mixture_windows

    assert apportion(4, [0.75, 0.25]) == [3, 1] and apportion(5, [0.5, 0.5]) == [3, 2]
    assert apportion(10, [0.98, 0.01, 0.01]) == [8, 1, 1]  # at least one each
    assert apportion(1, [0.25, 0.75]) == [0, 1]
    one = np.arange(1000)
    assert torch.equal(mixture_windows([one], [1.0], 5, 16, 32, 7, ["data"]),
                       calibration_windows(one, *default_windows(one, 5, 16, 32), 7))  # one stream: as before
    a, b = np.arange(0, 640), np.arange(10_000, 10_320)
    windows = mixture_windows([a, b], [0.75, 0.25], 8, 16, 32, 0, ["a", "b"])
    assert windows.shape == (8, 16) and (windows[:6] < 10_000).all() and (windows[6:] >= 10_000).all()
    with pytest.raises(ValueError, match="stream b: the calibration text holds 20 windows"):
        mixture_windows([a, b], [0.25, 0.75], 40, 16, 32, 0, ["a", "b"])


def test_calibrate_names_a_stream_without_held_out_split(streams, tmp_path):
    run_fsf("data", "build", str(streams / "digits.jsonl"), "--out", str(tmp_path / "no_eval"), "--seq-len", "32",
            "--eval-fraction", "0")
    run = tmp_path / "fs"
    run_fsf("train", QUICKSTART, f"run_dir={run}", f"data.streams=[{{path: {streams / 'prose'}}}, "
            f"{{path: {tmp_path / 'no_eval'}}}]", *TINY, *FS)
    proc = run_fsf("calibrate", str(run), "--windows", "2", "--seq-len", "16", check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert str(tmp_path / "no_eval") in proc.stderr
