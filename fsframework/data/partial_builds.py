"""The partial builds a killed data build leaves behind (docs/training.md, "The embedded corpus cache").

A build writes into a hidden folder beside its output, `.<name>.building-<pid>[-<token>]@<host>`,
and renames it into place when it is complete, so a reader never sees half a dataset; on any error
the build removes it. A build killed outright (SIGKILL, the OOM killer, a lost node) cannot: its
folder stays, as large as what it had written. `clean_partial_builds` removes, before a build of the
same output starts, every such folder whose build is gone: one written on this host by a process
that no longer runs. A folder of a live process, or of another host (a shared filesystem where
another node may be building the same embedded corpus), is left alone. (A folder named without a
host predates hosts in the name; it is taken for this host's.)
"""

from __future__ import annotations

import os
import re
import shutil
import socket
from pathlib import Path
from typing import Optional

_PARTIAL = re.compile(r"\.(?P<name>.+)\.building-(?P<pid>\d+)(?:-[0-9a-f]+)?(?:@(?P<host>.+))?")


def partial_build_dir(out_dir: Path, token: Optional[str] = None) -> Path:
    """This process's partial-build folder for `out_dir` (module docstring): a dot name no reader
    looks at, beside `out_dir` so the final rename is atomic; `token` tells concurrent builders of one
    process apart."""
    suffix = f"-{token}" if token else ""
    return out_dir.parent / f".{out_dir.name}.building-{os.getpid()}{suffix}@{socket.gethostname()}"


def _running(pid: int) -> bool:
    """A process of this id runs on this host (one we may not signal runs too)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_partial_builds(out_dir: Path) -> list[Path]:
    """Remove the partial builds of `out_dir` that killed builds on this host left (module docstring);
    returns the folders removed."""
    out_dir = Path(out_dir)
    if not out_dir.parent.is_dir():
        return []
    host, removed = socket.gethostname(), []
    for entry in sorted(out_dir.parent.iterdir()):
        match = _PARTIAL.fullmatch(entry.name)
        if (match is None or match["name"] != out_dir.name or not entry.is_dir()
                or (match["host"] or host) != host or _running(int(match["pid"]))):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed
