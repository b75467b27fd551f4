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
    log_eval_results(tmp_path / "tensorboard", results, step)

    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert scalars == {"eval/perplexity/256": [(300, 12.5)], "eval/perplexity/512": [(300, 14.0)],
                       "eval/passkey/256": [(300, 100.0)]}  # a length without a score logs nothing
    assert sorted(events.Tags()["images"]) == ["eval_plots/perplexity_vs_length", "eval_plots/score_vs_length"]
    image = events.Images("eval_plots/perplexity_vs_length")[0]
    assert image.step == 300 and image.width > 100 and image.height > 100
