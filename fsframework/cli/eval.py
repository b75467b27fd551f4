"""`fsf eval`: evaluate a checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from fsframework.checkpoints import Checkpoint, CheckpointError
from fsframework.cli.common import TASK_NAMES, checkpoint_dir, fail, input_dir, output_file, runtime
from fsframework.eval.ruler import SUITE

RULER_SAMPLES = 100  # the paper's protocol: 100 samples per task and length


def evaluate(checkpoint: Path = typer.Argument(..., help="run directory or checkpoint directory"),
             tasks: str = typer.Option("perplexity",
                                       help=f"comma-separated task names: {', '.join(TASK_NAMES)}"),
             lengths: Optional[str] = typer.Option(None, help="comma-separated lengths or FIRST:LAST:STEP ranges, "
                                                   "LAST included: 32:2976:128 (default: eval.lengths)"),
             num_samples: Optional[int] = typer.Option(None, help="samples per task and length (default: 100 with "
                                                       "--tasks ruler, the paper's protocol; else 10)"),
             batch_size: int = typer.Option(0, help="0: eval.batch_size of the checkpoint's config"),
             seed: int = typer.Option(0),
             out: Optional[Path] = typer.Option(None, help="JSON file of scores (default RUN/eval/scores.json)"),
             name: Optional[str] = typer.Option(None, help="label of this evaluation in tensorboard (default: the "
                                                "kind, read path and sample count)"),
             ruler_data: Optional[Path] = typer.Option(None, "--ruler-data",
                                                       help="folder holding the RULER QA files dev-v2.0.json (SQuAD) "
                                                       "and hotpot_dev_distractor_v1.json (HotpotQA) (default: "
                                                       "eval.ruler_data)"),
             stop_after_failure: Optional[bool] = typer.Option(None, "--stop-after-failure/--no-stop-after-failure",
                                                               help="skip longer lengths once the S-NIAH mean falls "
                                                               "below eval.ruler_fail_below (default: "
                                                               "eval.stop_after_failure)"),
             harness: Optional[str] = typer.Option(None, help="comma-separated lm-evaluation-harness tasks, run on "
                                                   "an export of the checkpoint instead of --tasks"),
             harness_include: Optional[Path] = typer.Option(None, "--harness-include",
                                                            help="folder of task YAML files of one's own"),
             overrides: Optional[List[str]] = typer.Argument(None, help="config overrides, e.g. model.attention.impl=reference")) -> None:
    """Evaluate a checkpoint: perplexity vs length and long-context retrieval tasks.

    Example: fsf eval runs/quickstart --tasks perplexity,passkey --lengths 512,1024,2048
    The RULER suite: fsf eval runs/quickstart --tasks ruler --lengths 512,2048 --ruler-data DIR
    """
    checkpoint_dir(checkpoint)
    if out is not None:
        output_file(out, "--out", replace=True)  # scores are rewritten by each evaluation, as the default file
    if harness:
        run_harness_command(checkpoint, harness, harness_include, out)
        return

    if ruler_data is not None:
        input_dir(ruler_data, "--ruler-data", "a folder holding the RULER QA files")
    try:
        names = parse_tasks(tasks)
        parsed_lengths = parse_lengths(lengths) if lengths else None
    except ValueError as exc:
        fail(str(exc))
    if num_samples is None:
        num_samples = RULER_SAMPLES if SUITE in names else 10
    try:
        runtime().runner.evaluate_checkpoint(checkpoint, tasks=names, lengths=parsed_lengths,
                            num_samples=num_samples, batch_size=batch_size or None, seed=seed, out=out,
                            overrides=overrides or [], name=name, ruler_data=ruler_data,
                            stop_after_failure=stop_after_failure)
    except (CheckpointError, FileNotFoundError, ValueError) as exc:  # ConfigError is a ValueError
        fail(str(exc))


def run_harness_command(checkpoint: Path, tasks: str, include: Optional[Path], out: Optional[Path]) -> None:
    """`--harness`: lm-evaluation-harness on an export; results to OUT (default <run>/eval/harness.json)."""
    import json

    from rich.console import Console

    rt = runtime()
    names = [t.strip() for t in tasks.split(",") if t.strip()]
    if include is not None:
        input_dir(include, "--harness-include", "a directory of task YAML files")
    try:
        out = out or Checkpoint.open(checkpoint).run.eval_dir / "harness.json"
        results = rt.harness.run_harness(checkpoint, names, include_path=include)
    except (CheckpointError, rt.export.ExportError, FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    for task, metrics in results["results"].items():
        shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float))
        Console(soft_wrap=True).print(f"{task}: {shown}", markup=False, highlight=False)
    Console(soft_wrap=True).print(f"wrote {out}", markup=False, highlight=False)


def parse_tasks(text: str) -> list[str]:
    """`--tasks`: comma-separated names of TASK_NAMES."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [name for name in names if name not in TASK_NAMES]
    if unknown or not names:
        raise ValueError(f"--tasks {text!r}: {'unknown ' + ', '.join(unknown) if unknown else 'no task named'}; "
                         f"choose from {', '.join(TASK_NAMES)}")
    return names


def parse_lengths(text: str) -> list[int]:
    """`--lengths`: comma-separated lengths and `FIRST:LAST:STEP` ranges (LAST included when the
    steps land on it): "32:2976:128" is 32, 160, ..., 2976 (the AR-GRC paper's protocol)."""
    found = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        pieces = item.split(":")
        try:
            numbers = [int(p) for p in pieces]
        except ValueError:
            raise ValueError(f"--lengths item {item!r} is not a length or a FIRST:LAST:STEP range") from None
        if len(numbers) == 1:
            found.extend(numbers)
        elif len(numbers) == 3 and numbers[2] > 0 and numbers[0] <= numbers[1]:
            found.extend(range(numbers[0], numbers[1] + 1, numbers[2]))
        else:
            raise ValueError(f"--lengths range {item!r} must be FIRST:LAST:STEP with FIRST <= LAST and STEP > 0")
    if not found or min(found) < 1:
        raise ValueError(f"--lengths {text!r} must list positive lengths")
    return found
