"""Hostfiles in the DeepSpeed / MPI format: one `host slots=N` line per node."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fsframework.launcher.errors import LaunchError

_LINE = re.compile(r"^(?P<host>[A-Za-z0-9_.:\-\[\]]+)\s+slots\s*=\s*(?P<slots>\d+)$")


@dataclass(frozen=True)
class Host:
    name: str
    slots: int  # GPUs (processes) this node may run


def parse_hostfile(text: str, origin: str = "hostfile") -> list[Host]:
    """Hosts in file order; blank lines and `#` comments are skipped.

    Raises LaunchError naming the line for anything that is not `host slots=N`
    with N > 0, and for a host listed twice (its ranks would collide)."""
    hosts: list[Host] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _LINE.match(line)
        if match is None or int(match["slots"]) == 0:
            raise LaunchError(f"{origin}:{number}: {raw.strip()!r} is not a hostfile line; "
                              "expected 'HOSTNAME slots=N' with N > 0")
        if any(h.name == match["host"] for h in hosts):
            raise LaunchError(f"{origin}:{number}: host {match['host']!r} is listed twice")
        hosts.append(Host(match["host"], int(match["slots"])))
    if not hosts:
        raise LaunchError(f"{origin} lists no hosts; expected lines like 'node001 slots=8'")
    return hosts


def read_hostfile(path: Path, *, nodes: int, gpus_per_node: int) -> list[Host]:
    """The first `nodes` hosts of PATH, each checked to offer `gpus_per_node` slots."""
    path = Path(path)
    if not path.is_file():
        raise LaunchError(f"hostfile not found: {path}")
    hosts = parse_hostfile(path.read_text(), origin=str(path))
    if len(hosts) < nodes:
        raise LaunchError(f"{path} lists {len(hosts)} host(s) but --nodes is {nodes}")
    hosts = hosts[:nodes]
    short = [h for h in hosts if h.slots < gpus_per_node]
    if short:
        names = ", ".join(f"{h.name} (slots={h.slots})" for h in short)
        raise LaunchError(f"--gpus-per-node is {gpus_per_node} but {path} offers fewer slots on {names}")
    return hosts
