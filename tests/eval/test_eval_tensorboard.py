"""`fsf eval` results reach the run's tensorboard: a scalar per task and length at the
checkpoint's step, and the plots as images."""

from __future__ import annotations

from pathlib import Path

from fsframework.eval.plots import write_plots
from fsframework.eval.runner import checkpoint_step
from fsframework.eval.tensorboard import log_eval_results


def test_scores_and_plots_are_logged_at_the_checkpoint_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    results = {"scores": {"perplexity": {"256": 12.5, "512": 14.0}, "passkey": {"256": 100.0, "512": None}},
               "ruler_mean": {}, "breakdown": {}}
    results["plots"] = write_plots(results, tmp_path / "eval")
    step = checkpoint_step(Path("runs/x/checkpoints/step_00000300"))
    assert step == 300
    log_eval_results(tmp_path / "tensorboard", results, step, label="fs-n10")

    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert scalars == {"eval/fs-n10/perplexity/256": [(300, 12.5)], "eval/fs-n10/perplexity/512": [(300, 14.0)],
                       "eval/fs-n10/passkey/256": [(300, 100.0)]}  # a length without a score logs nothing
    assert sorted(events.Tags()["images"]) == ["eval_plots/fs-n10/perplexity_vs_length",
                                               "eval_plots/fs-n10/score_vs_length"]
    image = events.Images("eval_plots/fs-n10/perplexity_vs_length")[0]
    assert image.step == 300 and image.width > 100 and image.height > 100


def _scalars(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_evaluations_that_read_differently_log_apart_and_an_export_keeps_its_step(tmp_path):
    from fsframework.export import export_checkpoint
    from tests.export.helpers import random_checkpoint
    from tests.utils import run_fsf

    run = random_checkpoint(tmp_path / "run", "fs", "train.tensorboard=true")  # its checkpoint is step 1
    passkey = ["--tasks", "passkey", "--lengths", "512"]
    run_fsf("eval", str(run), *passkey, "--num-samples", "1")
    run_fsf("eval", str(run), *passkey, "--num-samples", "2")
    run_fsf("eval", str(run), *passkey, "--num-samples", "1", "--name", "mine")
    run_fsf("eval", str(run), *passkey, "--num-samples", "1", "model.attention.top_k=1")
    tags = _scalars(run / "tensorboard")
    assert tags == {"eval/fs-top_k2-n1/passkey/512": [1], "eval/fs-top_k2-n2/passkey/512": [1],
                    "eval/mine/passkey/512": [1], "eval/fs-top_k1-n1/passkey/512": [1]}

    export_checkpoint(run, tmp_path / "out")
    run_fsf("eval", str(tmp_path / "out"), *passkey, "--num-samples", "1")
    assert _scalars(tmp_path / "out" / "tensorboard") == {"eval/fs-top_k2-n1/passkey/512": [1]}


def test_fsf_eval_runs_the_ruler_suite_end_to_end(tmp_path):
    """`fsf eval RUN --tasks ruler` on a checkpoint: all 13 tasks in the table and the JSON, the suite
    mean labelled with the tasks it averages, floors beside scores, and all of it in tensorboard."""
    import json

    from fsframework.eval.qa_fixture import write_qa_fixture
    from fsframework.eval.ruler import RULER_TASKS
    from tests.export.helpers import random_checkpoint
    from tests.utils import run_fsf

    run = random_checkpoint(tmp_path / "run", "tfpp", "train.tensorboard=true")  # the plumbing, not a kind's read
    data = write_qa_fixture(tmp_path / "qa")["qa_1"].parent
    proc = run_fsf("eval", str(run), "--tasks", "ruler", "--lengths", "2048", "--num-samples", "1", "--ruler-data",
                   str(data), "--batch-size", "1", env={"COLUMNS": "200"})
    saved = json.loads((run / "eval" / "scores.json").read_text())
    assert list(saved["scores"]) == list(RULER_TASKS) and saved["meta"]["num_samples"] == 1
    assert all(saved["scores"][t]["2048"] is not None for t in RULER_TASKS)
    assert saved["ruler_mean_tasks"] == {"2048": {"tasks": 12, "of": 12, "missing": []}}
    assert set(saved["ruler_floor"]) == set(RULER_TASKS)
    for task in RULER_TASKS:
        assert task in proc.stdout
    assert "12 of 12" in proc.stdout
    tags = _scalars(run / "tensorboard")
    label = next(iter(tags)).split("/")[1]
    for name in ("ruler_mean", "ruler_mean_floor", "ruler_mean_tasks", "cwe", "cwe_floor", "qa_2"):
        assert f"eval/{label}/{name}/2048" in tags, name
