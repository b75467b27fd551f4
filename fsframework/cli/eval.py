"""`fsf eval`: evaluate a checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from fsframework.cli.common import fail


def evaluate(checkpoint: Path = typer.Argument(..., help="run directory or checkpoint directory"),
             tasks: str = typer.Option("perplexity", help="comma-separated task names"),
             lengths: Optional[str] = typer.Option(None, help="comma-separated lengths (default: eval.lengths)"),
             num_samples: int = typer.Option(10, help="samples per task and length"),
             batch_size: int = typer.Option(0, help="0: eval.batch_size of the checkpoint's config"),
             seed: int = typer.Option(0),
             out: Optional[Path] = typer.Option(None, help="JSON file of scores (default <run>/eval/scores.json)"),
             overrides: Optional[List[str]] = typer.Argument(None, help="config overrides, e.g. model.attention.impl=reference")) -> None:
    """Evaluate a checkpoint: perplexity vs length and long-context retrieval tasks."""
    from fsframework.checkpoints import CheckpointError
    from fsframework.eval.runner import evaluate_checkpoint

    try:
        evaluate_checkpoint(checkpoint, tasks=[t.strip() for t in tasks.split(",") if t.strip()],
                            lengths=[int(x) for x in lengths.split(",")] if lengths else None,
                            num_samples=num_samples, batch_size=batch_size or None, seed=seed, out=out,
                            overrides=overrides or [])
    except (CheckpointError, ValueError) as exc:  # ConfigError is a ValueError
        fail(str(exc))
