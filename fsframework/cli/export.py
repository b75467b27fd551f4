"""`fsf export` (alias `fsf convert`) and `fsf import`: checkpoints to and from self-contained
safetensors directories that transformers reads, each proved by logits (docs/export.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from fsframework.checkpoints import CheckpointError, resolve_checkpoint
from fsframework.cli.common import EXIT_RUN_FAILED, checkpoint_dir, fail, input_dir, output_dir, runtime

EXPORT_SUBDIR = "export"  # `fsf convert RUN` without OUT_DIR: <checkpoint>/export


def export(checkpoint: Path = typer.Argument(..., help="run directory, checkpoint or export directory"),
           out_dir: Path = typer.Argument(..., help="new directory to write"),
           dtype: str = typer.Option("fp32", help="fp32 | bf16")) -> None:
    """Write a checkpoint (any ZeRO stage and layout) as config.json + model.safetensors + tokenizer +
    the run's data and eval settings, proved by the logits of a fixed batch (fp32: equal).

    Example: fsf export runs/quickstart exports/quickstart --dtype bf16
    """
    checkpoint_dir(checkpoint)
    _export(checkpoint, out_dir, dtype)


def convert(checkpoint: Path = typer.Argument(..., help="run directory, checkpoint or export directory"),
            out_dir: Optional[Path] = typer.Argument(None, help="new directory (default CHECKPOINT/export)"),
            dtype: str = typer.Option("fp32", help="fp32 | bf16")) -> None:
    """Alias of `fsf export`; without OUT_DIR it writes CHECKPOINT/export.

    Example: fsf convert runs/quickstart
    """
    checkpoint_dir(checkpoint)
    if out_dir is None:
        try:
            out_dir = resolve_checkpoint(checkpoint) / EXPORT_SUBDIR
        except CheckpointError as exc:
            fail(str(exc))
    _export(checkpoint, out_dir, dtype)


def _export(checkpoint: Path, out_dir: Path, dtype: str) -> None:
    export = runtime().export
    output_dir(out_dir, "OUT_DIR")
    try:
        result = export.export_checkpoint(checkpoint, out_dir, dtype=dtype, log=typer.echo)
    except (CheckpointError, export.ExportError) as exc:  # ConfigError is a ValueError, as ExportError
        fail(str(exc))
    except export.ProofFailed as exc:
        fail(str(exc), code=EXIT_RUN_FAILED)
    except ValueError as exc:
        fail(str(exc))
    typer.echo(f"largest |logit difference| source vs export ({dtype}): {result.max_difference:.3g}")
    if result.rounding_drift is not None:
        typer.echo(f"largest |logit difference| fp32 source vs {dtype} export (rounding): {result.rounding_drift:.3g}")
    typer.echo(f"wrote {result.out} ({result.tensors} tensors, {result.seconds:.1f}s)")


def import_(hf_dir: Path = typer.Argument(..., help="transformers Llama checkpoint directory (safetensors)"),
            out_dir: Path = typer.Argument(..., help="new export directory of a tfpp model"),
            dtype: str = typer.Option("fp32", help="fp32 | bf16"),
            tolerance: float = typer.Option(1e-4, help="largest allowed |logit difference| vs transformers")) -> None:
    """Import a Llama-architecture checkpoint as a tfpp model (an export directory that `fsf eval`,
    `train.init_from` and `fsf export` take), proved against transformers' own logits.

    Example: fsf import ./Llama-3.2-1B exports/llama-1b
    """
    export = runtime().export
    input_dir(hf_dir, "HF_DIR", "a transformers checkpoint directory")
    output_dir(out_dir, "OUT_DIR")
    try:
        result = export.import_llama(hf_dir, out_dir, dtype=dtype, tolerance=tolerance, log=typer.echo)
    except (CheckpointError, export.ExportError) as exc:
        fail(str(exc))
    except export.ProofFailed as exc:
        fail(str(exc), code=EXIT_RUN_FAILED)
    typer.echo(f"wrote {result.out} ({result.tensors} tensors, {result.seconds:.1f}s)")
