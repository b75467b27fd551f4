"""Parallelism (`parallel.*`; fsframework.parallel), and the one check of a world size against it."""

from __future__ import annotations

from dataclasses import dataclass

from fsframework.config.checks import ConfigError, choice, positive_fields


@dataclass
class ParallelConfig:
    sp: int = 1  # sequence-parallel group size
    # zigzag | contiguous: which tokens each SP rank holds (fsframework.parallel.sharding); zigzag
    # balances the causal work of the prefix kinds for the same bytes, the others always run contiguous,
    # as do all kinds with data.document_masking (a query's work then grows within its document)
    sp_layout: str = "zigzag"
    zero_stage: int = 0
    grad_accum: int = 1
    precision: str = "auto"  # auto (fp32 on CPU, bf16 on GPU) | fp32 | bf16
    backend: str = "auto"  # auto (nccl on GPU, gloo on CPU) | gloo | nccl
    timeout_s: int = 600


def check_parallel(p: ParallelConfig) -> None:
    choice("parallel.precision", p.precision, ("auto", "fp32", "bf16"))
    choice("parallel.backend", p.backend, ("auto", "gloo", "nccl"))
    choice("parallel.sp_layout", p.sp_layout, ("contiguous", "zigzag"))
    choice("parallel.zero_stage", p.zero_stage, (0, 1, 2, 3))
    positive_fields("parallel", p, ("sp", "grad_accum"))


def check_world_size(world_size: int, sp: int, *, world: str = "world size") -> int:
    """The data-parallel size of `world_size` ranks in sequence-parallel groups of `sp`; raise
    ConfigError when `world_size` is not a multiple of `sp`. `world` names the world size in
    the message (e.g. the options a launcher spells it out with)."""
    if sp < 1:
        raise ConfigError(f"parallel.sp={sp} must be >= 1")
    if world_size % sp:
        raise ConfigError(f"{world} {world_size} is not a multiple of parallel.sp={sp}: "
                          f"launch a multiple of {sp} ranks or change parallel.sp")
    return world_size // sp
