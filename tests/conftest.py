"""Shared fixtures: Triton interpreter on CPU, streaming shared-memory hygiene, a per-session data cache;
the scheduling of multi-rank tests under pytest-xdist."""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

import pytest
import torch

import fsframework.data  # noqa: F401  (streaming without its dataset zoo, as every fsf process imports it)
# the runs the parallel, resize and export tests share, defined once for every folder (session scope)
from tests.parallel.cli_runs import one_rank_two_micro_batches, two_rank_zero3_stopped_at_3  # noqa: F401

# Triton reads TRITON_INTERPRET when a kernel module is imported: on a CPU-only machine the
# kernels must run under the interpreter wherever a test first imports them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # what `fsf` sets for itself on a CPU host; set before any test imports deepspeed in-process
    os.environ.setdefault("DS_ACCELERATOR", "cpu")


def _share_the_cores_between_workers() -> None:
    """Under xdist each worker is one of `-n` test processes on this machine: torch's default of
    one thread per core in every worker (and in each process a test starts) would oversubscribe
    the cores, and small ops run slower, not faster, when threads contend."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        torch.set_num_threads(threads)


_share_the_cores_between_workers()


def pytest_itemcollected(item):
    """Tests marked `ranks` start several processes (torchrun, `run_ranks`) that use every core
    between them: under `--dist loadgroup` they form one xdist group, so one worker runs them one
    after another and no two such worlds ever run at once. (Marked here, as each test is
    collected: xdist reads the groups in its own pytest_collection_modifyitems.)"""
    if item.get_closest_marker("ranks") is not None:
        item.add_marker(pytest.mark.xdist_group("ranks"))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """xdist groups a test by appending `@group` to its id; where it cannot (a pytest it does not
    support) the multi-rank worlds would run side by side, so say so instead of running."""
    if getattr(config.option, "loadgroup", False):
        lost = [item.nodeid for item in items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
        if lost:
            raise pytest.UsageError(f"pytest-xdist did not group {lost[0]} (and {len(lost) - 1} more): "
                                    "install the pytest version pyproject.toml's dev extras name")


_SESSIONS_LOCK = Path(tempfile.gettempdir()) / "fsframework-test-sessions.lock"
_session_lock = None  # held shared by every pytest session on the machine, for its whole life


def _clean_streaming_shared_memory() -> None:
    """A killed run can leave mosaicml-streaming shared memory behind. streaming's cleaner
    unlinks every registered segment from prefix 0 up, live or not, so it runs only where no test
    runs beside it: in the pytest process before any test starts and after the last one ended
    (under xdist that is the controller, never a worker), and only when no other pytest session
    on the machine (a second checkout's suite) is running: each holds the sessions lock shared,
    the cleaner needs it alone."""
    global _session_lock
    try:
        from streaming.base.util import clean_stale_shared_memory
    except ImportError:
        return
    if _session_lock is None:
        _session_lock = open(_SESSIONS_LOCK, "a+")
    try:
        fcntl.flock(_session_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pass  # another session runs: its worlds' segments are live
    else:
        clean_stale_shared_memory()
    fcntl.flock(_session_lock, fcntl.LOCK_SH)


def _streaming_prefixes_of_this_process() -> None:
    """Every StreamingDataset on the machine registers the first free shared-memory prefix number
    (0, 1, ...); a multi-rank world takes its number in two steps with a barrier between, so a
    dataset made in another test process meanwhile can take the same number and one of the two
    fails. Datasets made inside a test process (in-process runs, data tests) count from a range
    of that process's own, far from the numbers the subprocess worlds take: the session's range
    (from its controller's pid, so two sessions on one machine do not share one) and in it the
    xdist worker's."""
    try:
        from streaming.base.shared import prefix
    except ImportError:
        return
    session = int(os.environ.setdefault("FSF_TEST_SHM_BASE", str(100_000 * (1 + os.getpid() % 5_000))))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    first = session + 1_000 * int(worker.removeprefix("gw"))

    def each_prefix_int():
        n = first
        while True:
            yield n
            n += 1

    prefix._each_prefix_int = each_prefix_int


def pytest_configure(config):
    if not hasattr(config, "workerinput"):
        _clean_streaming_shared_memory()
    _streaming_prefixes_of_this_process()


def pytest_unconfigure(config):
    global _session_lock
    if not hasattr(config, "workerinput"):
        _clean_streaming_shared_memory()
        if _session_lock is not None:  # the session ends: its shared hold ends with it
            _session_lock.close()
            _session_lock = None


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("embedded"))


@pytest.fixture(autouse=True)
def _grad_mode_left_as_found(request):
    """Tests share their process (in-process `fsf` runs, xdist workers): one that leaves autograd
    off would make every later training test in its worker fail far from the cause. Such a test
    fails itself instead, and the mode is put back."""
    before = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
    yield
    after = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
    if after != before:
        torch.set_grad_enabled(before[0])
        pytest.fail(f"{request.node.nodeid} left autograd (grad enabled, inference mode) at {after}, found {before}")
