"""Faults injected into training runs, for the tests of what a failing rank does.

A fault is `KIND:RANK:STEP`: `raise` makes rank RANK raise at the start of optimizer step
STEP (1-based), `hang` makes it sleep forever there (its peers must notice through the
process-group timeout), `stall` makes it block there in a system call that signals do not
interrupt (a read of a pipe nobody writes to, restarted by the kernel like a collective's
socket read: no Python signal handler runs, as in a step stuck in a long kernel), `stop` makes it
SIGSTOP itself there (frozen whole: a wedged node, a debugger's pause), `nan`
makes that rank's loss of that step NaN (`train.nonfinite`).
It enters as a wrapper of the source table (`fsframework.data.source_table.register_wrapper`,
docs/training.md): the rank's source raises, hangs or serves a batch whose recall weights are NaN.

- in the test process: `inject(monkeypatch, "raise:0:1")` before `run_fsf(...)`;
- in a process of its own (torchrun): `python -m tests.faults ARGS` is `fsf ARGS` with the
  fault of the environment's `FSF_FAULT` injected.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Callable

import torch

from fsframework.data import source_table
from fsframework.data.source_table import SourceContext
from fsframework.data.sources import Batch, BatchSource, WrappedSource
from fsframework.parallel.health import RankFailure

FAULT_ENV = "FSF_FAULT"
KINDS = ("raise", "hang", "stall", "stop", "nan")


def parse(spec: str) -> tuple[str, int, int]:
    try:
        kind, rank, step = spec.split(":")
        if kind not in KINDS:
            raise ValueError
        return kind, int(rank), int(step)
    except ValueError:
        raise ValueError(f"{FAULT_ENV}={spec!r} must look like KIND:RANK:STEP, KIND one of {', '.join(KINDS)}") from None


class FaultySource(WrappedSource):
    """`inner`, with the fault `kind` at optimizer step `step` (1-based) on this rank when it is `rank`."""

    def __init__(self, inner: BatchSource, kind: str, rank: int, step: int, my_rank: int):
        super().__init__(inner)
        self.kind, self.rank, self.step, self.my_rank = kind, rank, step, my_rank

    def next_batch(self, step: int, micro: int) -> Batch:
        batch = self.inner.next_batch(step, micro)
        if self.rank != self.my_rank or step + 1 != self.step or micro != 0:
            return batch
        if self.kind == "raise":
            raise RankFailure(f"rank {self.my_rank}: injected fault at step {self.step} ({FAULT_ENV})")
        if self.kind == "hang":
            # the trainer's SIGTERM handler would wait for a step end that never comes, so torchrun
            # would kill this rank only after its 30 s grace; a stuck rank dies of SIGTERM at once
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            while True:
                time.sleep(3600)
        if self.kind == "stop":  # SIGSTOP: the process is frozen, no handler or thread of it runs
            os.kill(os.getpid(), signal.SIGSTOP)
        if self.kind == "stall":
            read_end, self._write_end = os.pipe()  # the write end stays open: no end-of-file either
            os.read(read_end, 1)  # never returns
        return {**batch, "weights": torch.full(batch["targets"].shape, float("nan"))}


def fault_wrapper(spec: str) -> Callable[..., BatchSource]:
    """A source-table wrapper that injects fault `spec` into every run's source, outermost."""
    kind, rank, step = parse(spec)

    def faulty(cfg, source: BatchSource, ctx: SourceContext) -> BatchSource:
        return FaultySource(source, kind, rank, step, ctx.rank)

    return faulty


def inject(monkeypatch, spec: str) -> None:
    """Every Trainer built in this test injects fault `spec`."""
    monkeypatch.setitem(source_table.WRAPPERS, "fault", fault_wrapper(spec))


if __name__ == "__main__":
    from fsframework.cli import app

    source_table.register_wrapper("fault", fault_wrapper(os.environ[FAULT_ENV]))
    app(prog_name="fsf")
