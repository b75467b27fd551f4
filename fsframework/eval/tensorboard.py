"""`fsf eval` results in the run's tensorboard, next to the training curves (docs/evaluation.md).

Scalars `eval/<label>/<task>/<length>` (and `eval/<label>/ruler_mean/<length>`, with `ruler_mean_floor`,
`ruler_mean_tasks` (how many tasks the mean covers) and each RULER task's `<task>_floor`) at the evaluated
checkpoint's training step (an export's is its source's), so evaluations of successive checkpoints
draw a curve per task and length, and evaluations that read differently (another read path or
sample count, named by the label; `fsf eval --name` gives one) never overwrite each other; the
plots of the evaluation as images under `eval_plots/<label>/<name>`.
"""

from __future__ import annotations

from pathlib import Path


def log_eval_results(log_dir: Path, results: dict, step: int, label: str) -> None:
    """Append `results` (from `fsframework.eval.suite.run_eval`) to the tensorboard events in `log_dir`."""
    import matplotlib.image
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(log_dir))
    try:
        # RULER tasks' floors as `<task>_floor`, beside the other tasks' floors
        floors = {f"{task}_floor": values for task, values in results.get("ruler_floor", {}).items()}
        series = {**results.get("scores", {}), **floors, "ruler_mean": results.get("ruler_mean", {}),
                  "ruler_mean_floor": results.get("ruler_mean_floor", {}),
                  "ruler_mean_tasks": {n: c["tasks"] for n, c in results.get("ruler_mean_tasks", {}).items()}}
        for task, by_length in series.items():
            for length, value in by_length.items():
                if isinstance(value, (int, float)):  # None: the length did not fit the model or the data
                    writer.add_scalar(f"eval/{label}/{task}/{length}", value, step)
        # a mixture's streams apart (perplexity of each stream's held-out text)
        for stream, by_length in results.get("breakdown", {}).get("perplexity", {}).items():
            for length, value in by_length.items():
                if isinstance(value, (int, float)):
                    writer.add_scalar(f"eval/{label}/perplexity/{stream}/{length}", value, step)
        for plot in results.get("plots", []):
            image = matplotlib.image.imread(plot)  # H x W x (3 or 4), floats in [0, 1]
            writer.add_image(f"eval_plots/{label}/{Path(plot).stem}", image[..., :3], step, dataformats="HWC")
    finally:
        writer.close()
