"""Time spent in collectives, for the training step's `collectives_share` and `grad_reduce_share`.

`SP_COLLECTIVES` is the clock every sequence-parallel exchange of `fsframework.parallel` runs its
`torch.distributed` calls under (all-gathers, reduce-scatters, point-to-point messages); the trainer
starts it when a step starts, takes the step's lap when the step ends and reads the lap when the step
is logged. A process without sequence parallelism never enters it.

What is timed, by device:
- CPU (gloo): the calls return when the data has arrived, so the host's wall time is the
  collective's, the wait for the slowest peer included.
- CUDA (NCCL): a call returns once launched, so a host timer would measure the launch. A CUDA event
  is recorded on the current stream before and after the call instead: the current stream waits for
  the collective before its next kernel, so the pair spans the transfer and the wait for peers as the
  compute stream sees it. The events are read when the step is logged, after the step's work is
  done, so timing adds no synchronisation; a step not logged drops its events unread.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import torch


Events = list[tuple[torch.cuda.Event, torch.cuda.Event]]


class CollectiveLap:
    """The collectives of one step: host seconds (CPU) and event pairs (CUDA), read by `seconds()`."""

    def __init__(self, host_s: float, events: Events) -> None:
        self.host_s, self.events = host_s, events

    def seconds(self) -> float:
        """Waits for the last recorded collective on CUDA, done by the time a step is logged."""
        if self.events:
            self.events[-1][1].synchronize()
        return self.host_s + sum(start.elapsed_time(end) for start, end in self.events) / 1000


class CollectiveClock:
    """Time spent inside `timing()` between `start()` and `take()`. Outside (a validation, an
    evaluation, a test of the collectives) nothing is timed or kept: a CUDA event list that no step
    reads would only grow."""

    def __init__(self) -> None:
        self._host_s = 0.0
        self._events: Events = []
        self._running = False

    def start(self) -> None:
        self._host_s, self._events, self._running = 0.0, [], True

    def take(self) -> CollectiveLap:
        """What was timed since `start()`; the clock stops."""
        lap = CollectiveLap(self._host_s, self._events)
        self._host_s, self._events, self._running = 0.0, [], False
        return lap

    @contextmanager
    def timing(self, device: torch.device) -> Iterator[None]:
        if not self._running:
            yield
            return
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((start, end))
            return
        since = time.perf_counter()
        yield
        self._host_s += time.perf_counter() - since


# the sequence-parallel exchanges' clock (collectives.py, selected.py, retained.py, scan.py)
SP_COLLECTIVES = CollectiveClock()
