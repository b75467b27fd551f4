"""Process-group setup for one or many ranks (torchrun environment or a lone process)."""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterator

import torch


@dataclass
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup_environment() -> None:
    """DeepSpeed picks its accelerator from DS_ACCELERATOR; on a CPU-only host say so
    before deepspeed is imported, so it never probes for CUDA extensions."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def init_distributed(backend: str = "auto", timeout_s: int = 600) -> DistInfo:
    """Start (or join) the default process group. A lone process gets a 1-rank group so
    DeepSpeed and the collectives behave the same as under torchrun."""
    import torch.distributed as dist

    setup_environment()
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(_free_port())
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available()
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
    return DistInfo(rank=rank, world_size=world, local_rank=local, device=device)


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def max_over_ranks(value: int, device=None) -> int:
    """The largest of every rank's `value` (a collective: every rank calls it); `value` itself on one
    process. `device`: where the reduction runs (the backend's: CUDA under NCCL, by default)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    if device is None:
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([value], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())


def shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


@contextmanager
def multi_rank_job() -> Iterator[None]:
    """The length of a job (`fsf train`, `fsf run`): when it ends, by success or error, a
    multi-rank job leaves its process group (`shutdown`), so no rank exits with the group
    still up. A lone process keeps its one-rank group: a later run in the same process (the
    tests run `fsf` in process) joins it, since DeepSpeed keeps groups derived from it."""
    import torch.distributed as dist

    try:
        yield
    finally:
        if dist.is_initialized() and dist.get_world_size() > 1:
            shutdown()
