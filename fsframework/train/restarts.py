"""A run started again after a rank failed (`fsf launch --max-restarts`, docs/training.md, "When things
fail"): the launcher passes each restart's number and reason to the ranks by environment, and the
trainer says it (one line) and records it (`restarts` in every metrics record of the restarted run;
the launcher also appends `<run>/restarts.jsonl`)."""

from __future__ import annotations

import os
import signal
from typing import Optional

RESTART_ENV = "FSF_RESTART"  # the restart's number, 1 for the first
RESTART_REASON_ENV = "FSF_RESTART_REASON"  # which rank failed and how: "rank 1 was killed by SIGKILL"
# Fault injection for tests: "RANK:STEP" makes that rank kill itself (SIGKILL) after that step, in a
# run that is not a restart (so the restarted job gets past it)
KILL_ENV = "FSF_KILL_RANK_AT_STEP"


def restart_of_this_run() -> Optional[tuple[int, str]]:
    """(number, reason) when this process is a restart's rank, else None."""
    number = os.environ.get(RESTART_ENV)
    if not number or int(number) < 1:
        return None
    return int(number), os.environ.get(RESTART_REASON_ENV, "a rank failed")


def killed_here(rank: int, step: int) -> None:
    """`KILL_ENV`'s fault: SIGKILL this process when it is the rank and step named, before any restart."""
    spec = os.environ.get(KILL_ENV)
    if spec and restart_of_this_run() is None and spec == f"{rank}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)
