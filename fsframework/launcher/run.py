"""Start a launcher process here and report how it ended.

torchrun prints a failure summary (`Root Cause ... rank : N`) on stderr when a rank
exits non-zero; we pass stderr through line by line and pick the rank out of it, so
the final message names the rank that ended the job. stdout is inherited untouched,
so the rank-0 progress bar stays live on a terminal.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass

from fsframework.launcher.errors import LaunchError

_ROOT_CAUSE = re.compile(r"Root Cause")
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


@dataclass
class RunResult:
    returncode: int
    failed_rank: int | None = None  # global rank torchrun blamed first, when it said
    how: str | None = None  # how that rank ended: "was killed by SIGKILL", "exited with code 1"


def failed_rank_from(lines: list[str]) -> int | None:
    """The rank named under torchrun's `Root Cause (first observed failure)` heading."""
    return root_cause(lines)[0]


def root_cause(lines: list[str]) -> tuple[int | None, str | None]:
    """(rank, how it ended) from torchrun's `Root Cause (first observed failure)` block."""
    seen_root, rank = False, None
    for line in lines:
        if _ROOT_CAUSE.search(line):
            seen_root = True
        elif seen_root and rank is None and (m := _RANK.match(line)):
            rank = int(m.group(1))
        elif seen_root and rank is not None and (m := _EXITCODE.match(line)):
            code = int(m.group(1))
            if code >= 0:
                return rank, f"exited with code {code}"
            try:
                return rank, f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return rank, f"was killed by signal {-code}"
    return rank, None


FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def run_command(argv: list[str], env: dict[str, str], *, forward_signals: bool = False) -> RunResult:
    """Run ARGV with ENV added to this environment (PYTHONPATH prepended); wait for it.

    `forward_signals` (the torchrun agent, `fsframework.launcher.agent`): ARGV runs in a session
    of its own, so a terminal's Ctrl-C reaches this process alone, and SIGINT, SIGTERM and
    SIGHUP are passed on to it, each once; it passes them to the ranks and ends as they do.
    Without the new session the agent would get a Ctrl-C twice (from the terminal and from
    here), and two SIGINTs abort the ranks without waiting for the step to end."""
    full = dict(os.environ)
    for key, value in env.items():
        if key == "PYTHONPATH" and full.get(key):
            value = value + os.pathsep + full[key]
        full[key] = value
    try:
        proc = subprocess.Popen(argv, env=full, stderr=subprocess.PIPE, text=True, bufsize=1,
                                start_new_session=forward_signals)
    except FileNotFoundError:
        raise LaunchError(f"{argv[0]} not found; install torch (torchrun) / deepspeed in this environment") from None
    previous = {}
    if forward_signals:
        for signum in FORWARDED:
            previous[signum] = signal.signal(signum, lambda signum, frame: proc.send_signal(signum))
    tail: list[str] = []
    try:
        for line in proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            tail.append(line)
            del tail[:-200]  # the failure summary is at the end; keep memory bounded
        proc.wait()
    except KeyboardInterrupt:
        # Ctrl-C in a terminal reached the launcher too (same process group): give it time to
        # stop its ranks; a signal sent to us alone is passed on as SIGTERM.
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            proc.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    # A launcher killed by signal N reports -N; shells report 128 + N, which is a valid exit status.
    code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    return RunResult(code, *(root_cause(tail) if code else (None, None)))
