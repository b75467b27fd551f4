"""Launching a benchmark's worker ranks on this machine (the tools' shared helper, not a framework part).

A benchmark script runs itself as `world` processes, `script --worker SPEC`, with the variables
`torch.distributed.init_process_group` reads (gloo on the CPU) and collects the JSON line each
prints last.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world: int, spec: dict, script: str, timeout_s: float = 3600) -> list[dict]:
    """Run `world` ranks of `script --worker SPEC` on one machine (torch.distributed's env://
    variables, one thread each); each prints one JSON line last, returned in rank order. A failing
    rank stops the others, which would otherwise wait in a collective until the group's timeout."""
    port, procs, logs = _free_port(), [], []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "kernels")])}  # this checkout's kernels too
        log = tempfile.TemporaryFile(mode="w+")
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, script, "--worker", json.dumps(spec)], env=env,
                                      stdout=subprocess.PIPE, stderr=log, text=True))
    deadline, killed, timed_out = time.monotonic() + timeout_s, set(), False
    while any(p.poll() is None for p in procs):
        timed_out = time.monotonic() > deadline
        if timed_out or any(p.poll() not in (None, 0) for p in procs):
            for rank, p in enumerate(procs):
                if p.poll() is None:
                    p.kill()
                    killed.add(rank)
            break
        time.sleep(0.2)
    outputs = [p.communicate()[0] for p in procs]
    # the rank that failed by itself, not one this launcher stopped (its log ends in a collective's wait)
    failed = [r for r, p in enumerate(procs) if p.returncode and r not in killed] or sorted(killed)
    if failed:
        logs[failed[0]].seek(0)
        why = f"timed out after {timeout_s:.0f} s" if timed_out and not killed.isdisjoint(failed) else "failed"
        raise SystemExit(f"rank {failed[0]} of {world} {why}:\n{logs[failed[0]].read()[-4000:]}")
    return [json.loads(out.strip().splitlines()[-1]) for out in outputs]
