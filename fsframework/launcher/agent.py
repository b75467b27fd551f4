"""`python -m fsframework.launcher.agent ARGS`: torchrun (same ARGS) that ends as its ranks did.

torchrun's agent turns a job that stopped on purpose into a failure report: a Ctrl-C or SIGTERM
makes it raise `SignalException` (a traceback, exit code 1) and kill the ranks 30 s later, and
ranks that all exit with one code (a config error 2, preempted 75, interrupted 130; each said
so in one line on rank 0) end in a `ChildFailedError` report and exit code 1. This wrapper runs
the same agent (`torch.distributed.run`) with two changes:

- SIGINT and SIGTERM are passed on to the ranks, each once, and the agent keeps waiting for
  them (no 30 s kill): the ranks stop at the next step boundary (docs/training.md), and a
  second Ctrl-C reaches them as a second SIGINT, which aborts at once.
- When the first rank to end exited with one of `QUIET_CODES` and every other failed rank with
  the same code, or died of the agent's signal after it, the wrapper exits with that code and
  prints nothing more: the agent's log lines about ranks ending are held back until the job's
  end shows it failed. Any other failure keeps torchrun's report (it names the root-cause rank).

`fsf launch` starts it instead of torchrun. Imports torch: run it where the ranks run.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Iterable, Optional

EXIT_BAD_INPUT, EXIT_PREEMPTED, EXIT_INTERRUPTED = 2, 75, 130  # fsframework.cli.common, train.preemption
QUIET_CODES = (EXIT_BAD_INPUT, EXIT_PREEMPTED, EXIT_INTERRUPTED)
FORWARDED = ("SIGINT", "SIGTERM")


def job_exit_code(first: int, codes: Iterable[int]) -> Optional[int]:
    """The job's exit code when it stopped on purpose, else None (a failure). `first`: the exit
    code of the first rank to end; `codes`: those of every failed rank (negative: died of a
    signal, as the ranks the agent stops once one has ended)."""
    if first not in QUIET_CODES:
        return None
    return first if all(code == first or code < 0 for code in codes) else None


def _children() -> list[int]:
    """This process's children: the ranks (each in a session of its own, so a terminal's Ctrl-C
    does not reach them but through here)."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # ended meanwhile
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == me:  # field 4, after the parenthesized name
            found.append(int(entry))
    return found


def _forward(signum: int, frame) -> None:
    for pid in _children():
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _continue(pid) -> None:
    """SIGCONT to a rank the agent is about to stop: a stopped rank (SIGSTOP, a debugger's pause, a
    frozen node's process) would hold the agent's SIGTERM pending until its SIGKILL 30 s later;
    continued, it meets the SIGTERM (and its dead peers) at once."""
    try:
        os.kill(int(pid), signal.SIGCONT)
    except (ProcessLookupError, PermissionError, ValueError, TypeError):
        pass


class _HeldBack(logging.Filter):
    """Holds the agent's records about ranks that ended ('failed (exitcode: ...)', 'Sending
    process ... closing signal ...'); `release` logs them (a failure), else they are dropped."""

    PREFIXES = ("failed (exitcode:", "Sending process")

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(self.PREFIXES):
            if record.msg.startswith("Sending process") and record.args:
                _continue(record.args[0])
            self.records.append(record)
            return False
        return True

    def release(self, logger: logging.Logger) -> None:
        logger.removeFilter(self)
        for record in self.records:
            logger.handle(record)


def main(argv: Optional[list[str]] = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(sys.argv[1:] if argv is None else argv)
    # the agent's own handlers would raise SignalException for these; the rest (SIGHUP, SIGQUIT)
    # keep torchrun's meaning
    kept = [name for name in args.signals_to_handle.split(",") if name.strip() not in FORWARDED]
    args.signals_to_handle = ",".join(kept) or "SIGHUP"
    for name in FORWARDED:
        signal.signal(getattr(signal, name), _forward)
    agent_log, held = logging.getLogger("torch.distributed.elastic.multiprocessing.api"), _HeldBack()
    agent_log.addFilter(held)
    try:
        run(args)
    except ChildFailedError as exc:
        _, first = exc.get_first_failure()
        code = job_exit_code(first.exitcode, (failure.exitcode for failure in exc.failures.values()))
        if code is None:
            held.release(agent_log)
            raise
        return code
    held.release(agent_log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
