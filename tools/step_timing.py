"""Time and peak memory of a training step, for the benchmarks that run one per subprocess
(`bench_rewired.py`, `bench_loss.py`)."""

from __future__ import annotations

import json
import math
import resource
import subprocess
import sys
import time
from typing import Callable


def in_fresh_process(script: str, worker_args: list[str], label: str) -> dict:
    """Run `script` again with this process's arguments and `--worker *worker_args` in a fresh
    Python process (each measurement starts from a clean allocator and RSS) and return the JSON
    object its last output line holds; a failure raises naming `label`."""
    done = subprocess.run([sys.executable, script, *sys.argv[1:], "--worker", *worker_args], capture_output=True,
                          text=True)
    if done.returncode:
        raise RuntimeError(f"{label} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def max_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def time_steps(step: Callable[[], None], repeats: int, cuda: bool) -> dict:
    """{"time_s": the fastest of `repeats` calls of `step` after one warm-up call, "peak_bytes",
    "first_s": the warm-up call's time (kernels or graphs compiled in it included)}.

    Peak memory on a GPU is `torch.cuda.max_memory_allocated` after the warm-up's peak is reset
    (what the warm-up left allocated, such as gradients, counts); on a CPU it is the growth of the
    process's maximum RSS over its value before the warm-up (the maximum never comes down, so a
    baseline taken after the warm-up would count only what a later step takes beyond its peak).
    Modules a step would import lazily are imported before the baseline, so that they are not
    counted as the step's memory. On a GPU each call is timed to its end (synchronized).
    """
    import torch
    import torch._dynamo  # noqa: F401  (imported lazily by a first checkpoint or compiled call: +160 MB RSS)

    def finished_step() -> None:
        step()
        if cuda:
            torch.cuda.synchronize()

    base = max_rss_bytes()
    start = time.perf_counter()
    finished_step()  # warm-up: compile kernels, touch the allocator
    first = time.perf_counter() - start
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    best, peak = math.inf, 0
    for _ in range(repeats):
        start = time.perf_counter()
        finished_step()
        best = min(best, time.perf_counter() - start)
        peak = max(peak, torch.cuda.max_memory_allocated() if cuda else max_rss_bytes() - base)
    return {"time_s": best, "peak_bytes": peak, "first_s": first}
