"""Run an `fsf` command inside the test process and put back what it changes in the process.

A training run sets RANK/WORLD_SIZE/MASTER_PORT (and, on CPU, DS_ACCELERATOR), starts a
one-rank gloo process group, seeds torch's, numpy's and Python's generators and installs
signal handlers for the run's length. A later test in the same process must see none of it,
as it would after a subprocess: the environment, the generators, the thread count, autograd's mode
and the handlers are restored.

The one-rank process group is the exception: it stays up for the process's life, as in any
lone `fsf` process. DeepSpeed keeps the groups it derives from it in module globals, which a
destroyed and re-created default group would leave dangling; every in-process run is one rank
on gloo, so the next run finds the group it would have made (`init_distributed` joins it).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import traceback
import warnings
from contextlib import contextmanager
from typing import Iterator

_SIGNALS = [s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGUSR1", None),
                        getattr(signal, "SIGUSR2", None), getattr(signal, "SIGHUP", None)) if s is not None]


@contextmanager
def process_state_restored() -> Iterator[None]:
    import numpy as np
    import torch
    environ = dict(os.environ)
    handlers = {s: signal.getsignal(s) for s in _SIGNALS}
    rng = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    threads = torch.get_num_threads()
    grad = torch.is_grad_enabled()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(environ)
        for s, handler in handlers.items():
            signal.signal(s, handler)
        torch.set_rng_state(rng[0])
        np.random.set_state(rng[1])
        random.setstate(rng[2])
        torch.set_num_threads(threads)
        torch.set_grad_enabled(grad)


def _import_before_capture() -> None:
    """DeepSpeed binds its log handler to sys.stdout when first imported: import it outside the
    runner's captured stream, which is closed after the call."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed  # noqa: F401


def invoke_fsf(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    """`fsf ARGS` through typer's CliRunner; returncode is the command's exit code (1 with the
    traceback on stderr for an uncaught exception, as the interpreter would print it)."""
    from typer.testing import CliRunner

    from fsframework.cli import app

    _import_before_capture()
    # a process prints its warnings to stderr (the checkpoint fallbacks are warnings); pytest
    # would record them instead, so they are caught here and appended to the command's stderr
    with process_state_restored(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        result = CliRunner().invoke(app, args, env=env)
    stderr = result.stderr + "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno)
                                     for w in caught)
    if result.exc_info is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(*result.exc_info))
    return subprocess.CompletedProcess(["fsf", *args], result.exit_code, result.stdout, stderr)
