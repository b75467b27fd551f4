"""Run monitoring: metrics.jsonl, tensorboard scalars and a rich progress bar (rank 0 only)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from fsframework.checkpoints import RunDir

console = Console()


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop records after `last_step` (written after the checkpoint a run resumes from)."""
    if not path.is_file():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= last_step]
    path.write_text("".join(line + "\n" for line in kept))


def strict_json(record: dict[str, Any]) -> str:
    """One line of standard JSON: a non-finite number (a NaN loss) becomes `null`, which every
    JSON reader accepts (a bare `NaN` is Python's extension; jq, JavaScript and Go reject it)."""
    clean = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
    return json.dumps(clean, allow_nan=False)


class Monitor:
    def __init__(self, run_dir: Path | RunDir, *, total_steps: int, start_step: int, enabled: bool, progress: bool,
                 tensorboard: bool):
        run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
        self.enabled = enabled
        self.metrics_path = run.metrics
        self.writer = None
        self.progress = None
        if not enabled:
            return
        truncate_metrics(self.metrics_path, start_step)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(run.tensorboard), purge_step=start_step + 1)
        if progress:
            self.progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
                                     TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console)
            self.task = self.progress.add_task("train", total=total_steps, completed=start_step, loss="-", tps="-")
            self.progress.start()

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.metrics_path, "a") as f:
            f.write(strict_json(record) + "\n")
        if self.writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                    # keys with a section of their own ("val/loss") keep it; the rest are train/
                    self.writer.add_scalar(key if "/" in key else f"train/{key}", value, record["step"])
        if self.progress is not None:
            self.progress.update(self.task, completed=record["step"], loss=f"{record['loss']:.4f}",
                                 tps=f"{record['tokens_per_s']:.0f}")

    def advance(self, step: int) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=step)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
        if self.writer is not None:
            self.writer.close()
