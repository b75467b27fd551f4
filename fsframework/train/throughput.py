"""What a training step achieved: its FLOPs, TFLOP/s and MFU, its peak memory, and where its time went.

The FLOPs are the kind's own analytic count (`fsframework.models.flops`, docs/training.md), not the
dense-attention formula other frameworks credit every model with: a FreeSolo step is credited with
the cells it reads. MFU divides the achieved TFLOP/s of one device by that device's dense peak at
the run's compute dtype (`PEAK_TFLOPS`, or `train.peak_tflops`); a CPU has no entry, so a CPU run
logs TFLOP/s only unless a peak is set.
"""

from __future__ import annotations

import functools
import resource
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from fsframework.parallel.collective_time import CollectiveClock

# Dense (no structured sparsity) peak TFLOP/s from the vendors' datasheets, by compute dtype: bf16
# and fp16 on the tensor cores, fp32 without TF32 (PyTorch's default for matmuls). Matched against
# torch.cuda.get_device_name() in order, the first name contained in it wins (PCIe before the SXM
# part of the same chip).
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}),
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "fp32": 51.2}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
    ("L40S", {"bf16": 362.05, "fp16": 362.05, "fp32": 91.6}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "fp32": 30.3}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
)


def device_peak_tflops(device: torch.device, dtype: str, override: float = 0.0) -> Optional[float]:
    """The dense peak TFLOP/s of `device` at `dtype` (bf16 | fp16 | fp32): `override` when set (> 0),
    else the table's entry for the CUDA device's name; None when unknown (a CPU, an unlisted GPU)."""
    if override > 0:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for part, peaks in PEAK_TFLOPS:
        if part in name:
            return peaks.get(dtype)
    return None


def peak_memory_mb(device: torch.device) -> dict[str, float]:
    """The process's peaks so far: the host's resident set, and on a GPU what the caching allocator
    handed out (allocated) and held (reserved). MB."""
    memory = {"host_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if device.type == "cuda":
        memory["cuda_allocated_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        memory["cuda_reserved_mb"] = torch.cuda.max_memory_reserved(device) / 2**20
    return memory


@dataclass
class StepClock:
    """Wall time of one optimizer step by phase: waiting for the batch, forward and backward, the
    optimizer step. On a GPU the phases are read where the host waits for the device anyway (the
    loss's finiteness check ends forward and backward), so the clock adds no synchronisation; the
    optimizer's share is then its launch time, the rest of its work shows in the next phase read."""

    phases: dict[str, float] = field(default_factory=dict)
    _since: float = field(default_factory=time.perf_counter)

    def start(self) -> None:
        self.phases = {"data": 0.0, "compute": 0.0, "optimizer": 0.0}
        self._since = time.perf_counter()

    def lap(self, phase: str) -> None:
        """Add the time since the last lap (or the start) to `phase`."""
        now = time.perf_counter()
        self.phases[phase] += now - self._since
        self._since = now


def time_gradient_reduction(engine: Any, zero_stage: int, world_size: int) -> Optional[CollectiveClock]:
    """A clock of the engine's gradient reduction, where one call holds all of it: with several ranks,
    under ZeRO 0 and 1 DeepSpeed reduces every gradient in `allreduce_gradients`, at the end of the
    backward of a step's last micro-batch. Under ZeRO 2 and 3 hooks reduce buckets during the backward
    (overlapped with it on a GPU) and that call sends only the last ones: None, nothing timed, rather
    than a figure that leaves most of the reduction out."""
    if world_size == 1 or zero_stage > 1:
        return None
    clock, reduce = CollectiveClock(), engine.allreduce_gradients

    @functools.wraps(reduce)
    def timed_reduce(*args, **kwargs):
        with clock.timing(engine.device):
            return reduce(*args, **kwargs)

    engine.allreduce_gradients = timed_reduce  # the engine's backward calls it through the instance
    return clock


def step_record(*, elapsed: float, phases: dict[str, float], tokens: int, flops_per_token: float, world_size: int,
                peak_tflops: Optional[float], memory: dict[str, float],
                collectives: Optional[dict[str, float]] = None) -> dict[str, float]:
    """The throughput figures of one step of `elapsed` seconds that trained `tokens` tokens (all
    ranks) on `world_size` devices: tokens/s, FLOPs per token, achieved TFLOP/s per device, MFU
    (when the peak is known), the shares of the step spent waiting for data, in forward and backward
    and in the optimizer, and the peak memory. `collectives`: seconds of the step in collectives by
    name ("collectives", "grad_reduce"), each a part of the forward and backward's time, logged as
    `<name>_share` beside the phases (which still add up to the step)."""
    tflops = flops_per_token * tokens / elapsed / world_size / 1e12
    shares = {**phases, **(collectives or {})}
    record = {"tokens_per_s": tokens / elapsed, "flops_per_token": flops_per_token, "tflops": tflops,
              "step_s": elapsed, **{f"{phase}_share": seconds / elapsed for phase, seconds in shares.items()}}
    if peak_tflops:
        record["mfu"] = tflops / peak_tflops
    return {**record, **memory}
