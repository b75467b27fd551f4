"""Shared fixtures: streaming shared-memory hygiene and a per-session data cache."""

from __future__ import annotations

import pytest


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
