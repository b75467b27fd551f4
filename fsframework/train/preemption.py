"""Signals that end a run at a step boundary: preemption (checkpoint, then exit) and SIGINT (stop).

A handler only records the request; the loop acts on it between optimizer steps, after
every rank has agreed (`StopRequests.agree`, one all-reduce), so all ranks take the same
checkpoint at the same step and no rank leaves a collective behind. docs/training.md.

- `train.preempt_signals` (SIGTERM, SIGUSR1 by default): checkpoint at the next step
  boundary, then exit with `EXIT_PREEMPTED` (75: retry later); the batch script of
  `fsf launch --slurm` then requeues the job (launch/slurm.sbatch.tmpl).
- SIGINT: stop at the next step boundary without a new checkpoint, saying which checkpoint a
  rerun resumes from. A second SIGINT aborts at once: one line, exit code 130.

The second SIGINT is acted on by a thread, not by the handler: Python runs a handler only
when the main thread returns to the interpreter, and a step stuck in a long kernel or in a
collective (whose socket reads the kernel restarts, see `install`) may never do so. The
interpreter's C-level handler writes every signal's number to a wakeup pipe
(`signal.set_wakeup_fd`); the thread reads it and ends the process with `os._exit`, which
neither waits for the stuck step nor for the process group's shutdown.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Callable, Optional

import torch

from fsframework.parallel.process_group import max_over_ranks

# sysexits.h EX_TEMPFAIL: "a temporary failure; the user is invited to retry"
EXIT_PREEMPTED = 75
EXIT_INTERRUPTED = 130  # the shell's code for a process ended by SIGINT

NONE, INTERRUPT, PREEMPT = 0, 1, 2  # ordered: the all-reduce keeps the strongest request


_installed: Optional["StopRequests"] = None  # the requests whose wakeup pipe is set, if any


def _forget_pipe_in_child() -> None:
    """In a forked child (a data-loader worker): write no signal to the parent's wakeup pipe.
    A terminal's Ctrl-C reaches the workers too; counted in the parent, it would be a second SIGINT."""
    stops = _installed
    if stops is None or stops._wakeup is None:
        return
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:  # forked from another thread: the child has no handlers of ours to run
        pass
    for fd in stops._wakeup:
        os.close(fd)
    stops._wakeup = None


os.register_at_fork(after_in_child=_forget_pipe_in_child)


class RunStopped(Exception):
    """The loop stopped early on a signal; `code` is the process's exit code (the message was logged)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class StopRequests:
    """Records stop requests from signals; `install` and `restore` bracket the training loop."""

    def __init__(self, preempt_signals: list[str], *, report: Optional[bool] = None):
        self.preempt_signals = [getattr(signal, name) for name in preempt_signals]
        self.request = NONE
        self.signal_name: Optional[str] = None
        self._previous: dict[int, object] = {}
        # the line of an abort (second SIGINT); the trainer names the checkpoint once it knows it.
        # Every rank receives the signal; rank 0 alone says so (one line per job).
        self.abort_message: Callable[[], str] = lambda: ("aborted by a second SIGINT, without a checkpoint; a rerun "
                                                         "resumes from the newest complete checkpoint")
        self.report = os.environ.get("RANK", "0") == "0" if report is None else report
        self.before_abort: Callable[[], None] = lambda: None  # what must not be left behind (shared memory)
        self._wakeup: Optional[tuple[int, int]] = None  # (read end, write end) of the wakeup pipe
        self._previous_wakeup = -1
        self._sigints = 0
        self._watcher: Optional[threading.Thread] = None

    def _on_preempt(self, signum, frame) -> None:
        self.request, self.signal_name = PREEMPT, signal.Signals(signum).name

    def _on_interrupt(self, signum, frame) -> None:
        # a second SIGINT is the watcher thread's (`_watch`): it acts even while this handler
        # cannot run
        self.request = max(self.request, INTERRUPT)
        self.signal_name = self.signal_name or "SIGINT"

    def _watch(self, read_fd: int) -> None:
        """Count the SIGINTs of the wakeup pipe; abort on the second. Ends when the pipe closes."""
        try:
            while data := os.read(read_fd, 64):  # b"": restore() closed the write end
                self._sigints += data.count(signal.SIGINT)
                if self._sigints >= 2:
                    self.abort()
        finally:
            os.close(read_fd)

    def abort(self) -> None:
        """Exit 130 at once, rank 0 saying so in one line. Written with os.write to the standard
        error: the main thread may hold the lock of Python's buffered streams."""
        if self.report:
            try:
                message = self.abort_message()
            except Exception:  # the line must not stop the abort
                message = "aborted by a second SIGINT, without a checkpoint"
            try:
                os.write(2, f"{message}\n".encode(errors="replace"))
            except OSError:
                pass
        try:
            self.before_abort()
        except Exception:  # nothing may stop the abort
            pass
        os._exit(EXIT_INTERRUPTED)

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
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # set_wakeup_fd requires it: a full pipe drops a byte, never blocks
        self._wakeup = (read_fd, write_fd)
        self._previous_wakeup = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        global _installed
        _installed = self
        self._watcher = threading.Thread(target=self._watch, args=(read_fd,), name="fsf-second-sigint", daemon=True)
        self._watcher.start()

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        if self._wakeup is not None:
            global _installed
            _installed = None
            signal.set_wakeup_fd(self._previous_wakeup)
            os.close(self._wakeup[1])  # the watcher reads end-of-file, closes the read end and returns
            self._wakeup = None
            # ended before the process is: a daemon thread that wakes during the interpreter's
            # finalization is ended by pthread_exit, whose unwinding aborts the process (SIGABRT)
            self._watcher.join(timeout=5)

    def agree(self, world_size: int, device: torch.device) -> int:
        """The strongest request of any rank (collective over the world: every rank calls it
        at the same step boundary); NONE, INTERRUPT or PREEMPT."""
        request = max_over_ranks(self.request, device) if world_size > 1 else self.request
        if request == PREEMPT and self.signal_name is None:
            self.signal_name = "a peer rank's preemption signal"
        return request
