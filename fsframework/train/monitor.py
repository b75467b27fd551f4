"""Run monitoring: metrics.jsonl, tensorboard scalars and, on stdout, a rich progress bar on a
terminal or plain lines elsewhere (rank 0 only).

A cluster job's stdout is a file (SLURM, nohup, CI), where a progress bar shows nothing until the
run ends; there, and with `train.progress=false`, every logged step (`train.log_every`) prints one
plain line (step, loss, lr, tokens/s, ETA). Validations and the end of the run print a line in
both modes. Messages are never wrapped (a wrapped line splits the paths it names).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from fsframework.checkpoints import RunDir
from fsframework.checkpoints.writing import atomic_write_text
from fsframework.train.hparams import HParam, write_session_start

console = Console(soft_wrap=True)


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop records after `last_step` (written after the checkpoint a run resumes from), and a torn last
    line (a write cut short by a full disk or a kill); the file is replaced whole, never half rewritten."""
    if not path.is_file():
        return
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    kept = []
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break  # the last line, torn
            raise
        if record["step"] <= last_step:
            kept.append(line)
    atomic_write_text(path, "".join(line + "\n" for line in kept))


def strict_json(record: dict[str, Any]) -> str:
    """One line of standard JSON: a non-finite number (a NaN loss) becomes `null`, which every
    JSON reader accepts (a bare `NaN` is Python's extension; jq, JavaScript and Go reject it)."""
    clean = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
    return json.dumps(clean, allow_nan=False)


# what the end-of-run summary reads of each logged step
SUMMARY_KEYS = ("tokens_per_s", "tflops", "mfu", "host_rss_mb", "cuda_allocated_mb", "cuda_reserved_mb")


# the collectives' shares of a step, by their label on the plain line
COLLECTIVE_SHARES = (("collectives_share", "collectives"), ("grad_reduce_share", "grad reduce"))


def throughput_text(record: dict[str, Any]) -> str:
    """A logged step's TFLOP/s (MFU where known), peak memory, data-wait share and collectives' shares,
    for the plain line."""
    if "tflops" not in record:
        return ""
    mfu = f" (MFU {record['mfu']:.1%})" if "mfu" in record else ""
    memory = (f"cuda {record['cuda_allocated_mb']:,.0f} MB" if "cuda_allocated_mb" in record
              else f"rss {record['host_rss_mb']:,.0f} MB")
    # the collectives where a run has them (sequence parallelism, gradient reduction on several ranks)
    collectives = "".join(f"  {label} {record[key]:.0%}" for key, label in COLLECTIVE_SHARES if key in record)
    return f"  TFLOP/s {record['tflops']:.3g}{mfu}  {memory}  data {record['data_share']:.0%}{collectives}"


def summary_throughput(records: list[dict[str, Any]]) -> str:
    """The end-of-run figures: median tokens/s and TFLOP/s per device (MFU) over the logged steps,
    the peak memory."""
    def median(key: str) -> float:
        return statistics.median_high(r[key] for r in records)

    text = f"median {median('tokens_per_s'):,.0f} tokens/s"
    if all("tflops" in r for r in records):
        text += f", {median('tflops'):.3g} TFLOP/s per device"
        if all("mfu" in r for r in records):
            text += f" (MFU {median('mfu'):.1%})"
    last = records[-1]
    if "cuda_allocated_mb" in last:
        text += (f", peak memory {last['cuda_allocated_mb']:,.0f} MB allocated / "
                 f"{last['cuda_reserved_mb']:,.0f} MB reserved")
    elif "host_rss_mb" in last:
        text += f", peak host memory {last['host_rss_mb']:,.0f} MB"
    return text


def say(line: str) -> None:
    """One plain line on stdout: no markup, no highlighting, never wrapped."""
    console.print(line, markup=False, highlight=False, soft_wrap=True)


class Monitor:
    def __init__(self, run_dir: Path | RunDir, *, total_steps: int, start_step: int, enabled: bool, progress: bool,
                 tensorboard: bool, config_yaml: str = "", hparams: dict[str, HParam] | None = None):
        run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
        self.enabled = enabled
        self.metrics_path = run.metrics
        self.writer = None
        self.progress = None
        self.total_steps, self.start_step = total_steps, start_step
        self.started = time.perf_counter()
        self.last: dict[str, Any] = {}
        # this session's logged throughput figures (only those: a long run logs many steps)
        self.rates: list[dict[str, Any]] = []
        self.plain = enabled and not (progress and console.is_terminal)
        if not enabled:
            return
        truncate_metrics(self.metrics_path, start_step)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(run.tensorboard), purge_step=start_step + 1)
            if config_yaml:  # the run's resolved config in the text tab, as a code block (4-space indent)
                self.writer.add_text("config", "".join(f"    {line}\n" for line in config_yaml.splitlines()),
                                     start_step)
            if hparams:  # the HPARAMS tab: one row per run, its scalars' last values beside it
                write_session_start(self.writer, hparams, start_step)
        if progress and not self.plain:
            self.progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
                                     TextColumn("{task.fields[tflops]} TFLOP/s"),
                                     TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console)
            self.task = self.progress.add_task("train", total=total_steps, completed=start_step, loss="-", tps="-",
                                              tflops="-")
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
        self.last = record
        if "tokens_per_s" in record:
            self.rates.append({key: record[key] for key in SUMMARY_KEYS if key in record})
        if self.progress is not None:
            self.progress.update(self.task, completed=record["step"], loss=f"{record['loss']:.4f}",
                                 tps=f"{record['tokens_per_s']:.0f}",
                                 tflops=f"{record['tflops']:.3g}" if "tflops" in record else "-")
        if self.plain:
            lr = f"  lr {record['lr']:.3g}" if "lr" in record else ""  # a record without one (a test's) still prints
            slowest = (f"  slowest rank {record['rank_slowest']} ({record['rank_busy_s_max']:.3g} s busy)"
                       if "rank_slowest" in record else "")  # several ranks (fsframework.train.stragglers)
            say(f"step {record['step']}/{self.total_steps}  loss {record['loss']:.4f}{lr}  "
                f"tokens/s {record['tokens_per_s']:,.0f}{throughput_text(record)}{slowest}  "
                f"ETA {self.eta(record['step'])}")
        if "val/loss" in record:
            streams = ", ".join(f"{key[len('val/loss/'):]} {value:.4f}" for key, value in record.items()
                                if key.startswith("val/loss/"))
            say(f"validation at step {record['step']}: loss {record['val/loss']:.4f}, perplexity "
                f"{record['val/ppl']:.3f} (best {record['val/best_ppl']:.3f})"
                + (f"; per stream: {streams}" if streams else ""))

    def eta(self, step: int) -> str:
        done = step - self.start_step
        if done <= 0:
            return "-"
        left = (time.perf_counter() - self.started) / done * (self.total_steps - step)
        return str(timedelta(seconds=round(max(left, 0.0))))

    def summary(self, step: int, tokens: int, checkpoint: Path | None) -> None:
        """The end-of-run line: steps, tokens, time, last loss and the checkpoint a rerun reads."""
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.started
        parts = [f"finished at step {step}/{self.total_steps}", f"{tokens:,} tokens",
                 f"{timedelta(seconds=round(elapsed))} this session"]
        if "loss" in self.last:
            parts.append(f"last loss {self.last['loss']:.4f}")
        if "val/best_ppl" in self.last:
            parts.append(f"best validation perplexity {self.last['val/best_ppl']:.3f}")
        if self.rates:
            parts.append(summary_throughput(self.rates))
        if checkpoint is not None:
            parts.append(f"checkpoint {checkpoint}")
        say(", ".join(parts))

    def advance(self, step: int) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=step)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
        if self.writer is not None:
            self.writer.close()
