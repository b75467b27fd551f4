"""`fsf calibrate`: FS-B's per-head key-norm thresholds of a FreeSolo checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from fsframework.checkpoints import CheckpointError
from fsframework.cli.common import checkpoint_dir, fail, input_dir, runtime


def calibrate(checkpoint: Path = typer.Argument(..., help="run directory or checkpoint directory (FS or FS-L)"),
              data: Optional[Path] = typer.Option(None, help="MDS directory of text (default: the run's eval split)"),
              windows: Optional[int] = typer.Option(None, help="number of windows run through the model "
                                                    "(default: 64, or as many as the held-out text holds)"),
              seq_len: Optional[int] = typer.Option(None, "--seq-len", help="tokens per window (default: 4096, or "
                                                    "the run's data.seq_len when the text holds no such window)"),
              seed: int = typer.Option(0, help="seed of the window shuffle"),
              batch_size: int = typer.Option(1, "--batch-size", help="windows per forward pass")) -> None:
    """Write CHECKPOINT/calibration.json, FS-B's per-head thresholds, and a heat map beside it.

    The median max key norm per cell, per layer and head (FS-B's tau). Runs under torchrun too (windows split over the ranks).

    Example: fsf calibrate runs/fs --windows 32 --seq-len 4096
    """
    from rich.console import Console

    checkpoint_dir(checkpoint)
    if data is not None:
        data = mds_directory(data)
    try:
        record = runtime().calibrate.calibrate(checkpoint, data=str(data) if data else None, windows=windows, seq_len=seq_len,
                                 seed=seed, batch_size=batch_size)
    except (CheckpointError, FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    if "file" in record:
        Console().print(f"wrote {record['file']} ({record['n_layers']} layers x {record['n_heads']} heads, "
                        f"{record['cells']} cells per head) and {record['heatmap']}")


def mds_directory(data: Path) -> Path:
    """`--data`: an MDS dataset, or a dataset root whose held-out split (`eval/`) is read; exits 2
    naming the problem before the model is loaded."""
    input_dir(data, "--data", "an MDS dataset directory")
    for candidate in (data, data / "eval"):
        if (candidate / "index.json").is_file():
            return candidate
    fail(f"--data {data}: no MDS dataset in it (no index.json, nor eval/index.json; build one with `fsf data build`)")
