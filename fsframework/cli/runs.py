"""`fsf runs`: runs side by side, from what each wrote."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from fsframework.checkpoints import CheckpointError
from fsframework.checkpoints.run_summary import summarize_run
from fsframework.cli.common import fail, output_file


def _figure(value: Optional[float], spec: str) -> str:
    return "-" if value is None else format(value, spec)


def runs(paths: List[Path] = typer.Argument(..., help="run directories"),
         plot: Optional[Path] = typer.Option(None, "--plot",
                                             help="write loss and throughput curves to this PNG")) -> None:
    """Compare runs: kind, sizes, steps, final and best validation loss, median tokens/s, TFLOP/s
    and MFU, peak memory.

    Example: fsf runs runs/fs runs/tfpp --plot compare.png
    """
    if plot is not None:
        output_file(plot, "--plot", replace=True)
    try:
        summaries = [summarize_run(path) for path in paths]
    except CheckpointError as exc:
        fail(str(exc))
    table = Table(box=None, pad_edge=False)
    for column in ("run", "kind", "d x L x H @ T", "steps", "loss", "val loss", "best val", "tokens/s", "TFLOP/s",
                   "MFU", "peak MB"):
        table.add_column(column, justify="left" if column in ("run", "kind", "d x L x H @ T") else "right")
    for s in summaries:
        table.add_row(s.name, s.kind, s.sizes, str(s.steps), _figure(s.final_loss, ".4f"),
                      _figure(s.final_val_loss, ".4f"), _figure(s.best_val_loss, ".4f"),
                      _figure(s.tokens_per_s, ",.0f"), _figure(s.tflops, ".3g"), _figure(s.mfu, ".1%"),
                      _figure(s.peak_memory_mb, ",.0f"))
    Console(highlight=False, soft_wrap=True, width=200).print(table)
    if plot is not None:
        from fsframework.eval.plots import plot_runs  # matplotlib takes ~1 s to import: only for --plot

        typer.echo(f"wrote {plot_runs(summaries, plot)}")
