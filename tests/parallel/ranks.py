"""Run a Python script as N real ranks (env RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, gloo on CPU)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(script: Path, world: int, *args: str, timeout: float = 180, env: dict | None = None) -> list[str]:
    """Start `world` processes of `python script args`; return their stdout+stderr, rank order.

    Raises AssertionError with every rank's output when one fails, and kills the others
    so a broken rank never leaves its peers hanging in a collective.
    """
    port = free_port()
    procs = []
    path = os.pathsep.join([str(REPO), str(REPO / "kernels")])  # this checkout's fsframework and its kernels
    for rank in range(world):
        full_env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "DS_ACCELERATOR": "cpu",
                    "OMP_NUM_THREADS": "1", "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **(env or {})}
        procs.append(subprocess.Popen([sys.executable, str(script), *args], cwd=REPO, env=full_env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs):
        if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
            break
        time.sleep(0.1)
    for p in procs:
        if p.poll() is None:
            p.kill()
    outputs = [p.communicate()[0] for p in procs]
    codes = [p.returncode for p in procs]
    if any(codes):
        report = "\n".join(f"--- rank {r} (exit {c}) ---\n{o}" for r, (c, o) in enumerate(zip(codes, outputs)))
        raise AssertionError(f"{script.name} with {world} ranks failed:\n{report}")
    return outputs


def finish_rank(errors: list[str], rank: int) -> None:
    """The end of a worker script: print this rank's errors, wait for every rank, leave the group
    and exit non-zero when anything failed (what `run_ranks` reads)."""
    import torch.distributed as dist

    for error in errors:
        print(f"rank {rank}: {error}")
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(1 if errors else 0)
