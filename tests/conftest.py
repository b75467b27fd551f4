"""Shared fixtures: Triton interpreter on CPU, streaming shared-memory hygiene, a per-session data cache;
the scheduling of multi-rank tests under pytest-xdist."""

from __future__ import annotations

import os

import pytest
import torch

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


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """Tests marked `ranks` start several processes (torchrun, `run_ranks`) that use every core
    between them: under `--dist loadgroup` they form one xdist group, so one worker runs them one
    after another and no two such worlds ever run at once."""
    for item in items:
        if item.get_closest_marker("ranks") is not None:
            item.add_marker(pytest.mark.xdist_group("ranks"))


@pytest.fixture(scope="session", autouse=True)
def _clean_streaming_shared_memory():
    """A killed run can leave mosaicml-streaming shared memory behind; start clean."""
    try:
        from streaming.base.util import clean_stale_shared_memory
    except ImportError:
        yield
        return
    clean_stale_shared_memory()
    yield
    clean_stale_shared_memory()


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("embedded"))
