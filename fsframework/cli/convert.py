"""`fsf convert`: consolidate a checkpoint into one fp32 file."""

from __future__ import annotations

from pathlib import Path

import typer

from fsframework.cli.common import EXIT_RUN_FAILED, fail


def convert(checkpoint: Path = typer.Argument(..., help="run directory or checkpoint directory")) -> None:
    """Consolidate a (ZeRO-sharded) checkpoint into one fp32 file, with a logit-equality proof.

    Example: fsf convert runs/quickstart
    """
    from fsframework.checkpoints import CheckpointError, convert_to_fp32
    from fsframework.config import ConfigError

    try:
        out, diff = convert_to_fp32(checkpoint)
    except (CheckpointError, ConfigError) as exc:
        fail(str(exc))
    typer.echo(f"wrote {out} (max |logit difference| vs the engine checkpoint: {diff:.3g})")
    if diff != 0.0:
        fail("converted weights do not reproduce the checkpoint's logits", code=EXIT_RUN_FAILED)
