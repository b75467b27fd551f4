"""Shared fixtures: Triton interpreter on CPU, streaming shared-memory hygiene, a per-session data cache."""

from __future__ import annotations

import os

import pytest
import torch

# Triton reads TRITON_INTERPRET when a kernel module is imported: on a CPU-only machine the
# kernels must run under the interpreter wherever a test first imports them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


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
