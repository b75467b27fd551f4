"""`train.profile`: torch.profiler traces of chosen steps and, on a GPU, a CUDA memory snapshot.

Off by default, and then nothing is imported or recorded. When on, steps `start` .. `start + steps
- 1` (the step numbers of the log) are traced on the ranks listed, written to
`<run>/profile/rank<r>.<time>.pt.trace.json`: tensorboard's profiler tab reads that folder
(`tensorboard --logdir <run>/profile`), and so do Chrome's trace viewer (chrome://tracing) and
Perfetto. On a GPU `memory: true` also records the allocator's history over the same steps and
dumps it as `rank<r>.memory.pickle`, which https://pytorch.org/memory_viz draws. docs/training.md
says how to read both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from fsframework.config.train import ProfileConfig


class StepProfiler:
    """Starts the profiler before step `start` and writes its trace after the last traced step."""

    def __init__(self, cfg: ProfileConfig, rank: int, out_dir: Path, device: torch.device):
        self.cfg, self.rank, self.out_dir, self.device = cfg, rank, Path(out_dir), device
        self.enabled = cfg.steps > 0 and rank in cfg.ranks
        self.last = cfg.start + cfg.steps - 1
        self.profiler: Optional[torch.profiler.profile] = None
        self.memory = self.enabled and cfg.memory and device.type == "cuda"
        self.written: list[Path] = []

    def before_step(self, step: int) -> None:
        """`step`: the number the step about to run will be logged with."""
        if not self.enabled or step != self.cfg.start:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        if self.memory:
            torch.cuda.memory._record_memory_history(max_entries=100_000)
        self.profiler = torch.profiler.profile(activities=activities, record_shapes=True, profile_memory=True)
        self.profiler.__enter__()

    def after_step(self, step: int) -> None:
        """`step`: the number of the step that just ran."""
        if self.profiler is not None and step >= self.last:
            self._write()

    def close(self) -> None:
        """A run that ends (or stops) inside the traced steps still writes what it traced."""
        if self.profiler is not None:
            self._write()

    def _write(self) -> None:
        """Stop the profiler and write its trace (and the memory snapshot)."""
        self.profiler.__exit__(None, None, None)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        before = set(self.out_dir.glob("*.pt.trace.json"))
        torch.profiler.tensorboard_trace_handler(str(self.out_dir), worker_name=f"rank{self.rank}")(self.profiler)
        self.written += sorted(set(self.out_dir.glob("*.pt.trace.json")) - before)
        self.profiler = None
        if self.memory:
            snapshot = self.out_dir / f"rank{self.rank}.memory.pickle"
            torch.cuda.memory._dump_snapshot(str(snapshot))
            torch.cuda.memory._record_memory_history(enabled=None)
            self.written.append(snapshot)
