"""Signals that end a run at a step boundary: preemption (checkpoint, then exit) and SIGINT (stop).

A handler only records the request; the loop acts on it between optimizer steps, after
every rank has agreed (`StopRequests.agree`, one all-reduce), so all ranks take the same
checkpoint at the same step and no rank leaves a collective behind. docs/training.md.

- `train.preempt_signals` (SIGTERM, SIGUSR1 by default): checkpoint at the next step
  boundary, then exit with `EXIT_PREEMPTED` (75: retry later); the batch script of
  `fsf launch --slurm` then requeues the job (launch/slurm.sbatch.tmpl).
- SIGINT: stop at the next step boundary without a new checkpoint, saying which checkpoint a
  rerun resumes from. A second SIGINT interrupts at once (KeyboardInterrupt).
"""

from __future__ import annotations

import signal
import threading
from typing import Optional

import torch

# sysexits.h EX_TEMPFAIL: "a temporary failure; the user is invited to retry"
EXIT_PREEMPTED = 75
EXIT_INTERRUPTED = 130  # the shell's code for a process ended by SIGINT

NONE, INTERRUPT, PREEMPT = 0, 1, 2  # ordered: the all-reduce keeps the strongest request


class RunStopped(Exception):
    """The loop stopped early on a signal; `code` is the process's exit code (the message was logged)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class StopRequests:
    """Records stop requests from signals; `install` and `restore` bracket the training loop."""

    def __init__(self, preempt_signals: list[str]):
        self.preempt_signals = [getattr(signal, name) for name in preempt_signals]
        self.request = NONE
        self.signal_name: Optional[str] = None
        self._previous: dict[int, object] = {}

    def _on_preempt(self, signum, frame) -> None:
        self.request, self.signal_name = PREEMPT, signal.Signals(signum).name

    def _on_interrupt(self, signum, frame) -> None:
        if self.request == INTERRUPT:  # asked twice: do not wait for the step to end
            raise KeyboardInterrupt
        self.request = max(self.request, INTERRUPT)
        self.signal_name = self.signal_name or "SIGINT"

    def install(self) -> None:
        """Handlers for the preemption signals and SIGINT. Python takes handlers from the main
        thread only; a loop run from another thread keeps the process's handlers."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.preempt_signals:
            self._previous[signum] = signal.signal(signum, self._on_preempt)
        self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_interrupt)
        for signum in self._previous:
            # restart interrupted system calls: a signal during a collective must not fail the
            # communication library's socket read with EINTR; the flag is read at the boundary
            signal.siginterrupt(signum, False)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def agree(self, world_size: int, device: torch.device) -> int:
        """The strongest request of any rank (collective over the world: every rank calls it
        at the same step boundary); NONE, INTERRUPT or PREEMPT."""
        request = self.request
        if world_size > 1:
            import torch.distributed as dist

            flag = torch.tensor([request], dtype=torch.int32, device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            request = int(flag.item())
        if request == PREEMPT and self.signal_name is None:
            self.signal_name = "a peer rank's preemption signal"
        return request
