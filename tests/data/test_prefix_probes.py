"""Building StreamingDatasets again and again in one process does not accumulate open file
descriptors: streaming's search for a free shared-memory prefix attaches to every existing prefix
(`streaming.base.shared.prefix`), and with `close_prefix_probes` those attachments close when
dropped instead of living in `atexit` until the process ends."""

from __future__ import annotations

import gc
import os

from fsframework.data import streaming_package
from fsframework.data.loader import close_prefix_probes


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_attachments_of_the_prefix_search_close_when_dropped():
    streaming_package.install()
    from streaming.base.shared import prefix
    from streaming.base.shared.memory import SharedMemory

    close_prefix_probes()
    close_prefix_probes()  # idempotent: one wrapper
    assert prefix.SharedMemory.closes_when_dropped
    name = f"fsf_probe_{os.getpid()}"  # a segment of this test's own, never a prefix a dataset uses
    segment = SharedMemory(name, True, 64, auto_cleanup=False)
    try:
        before = _open_descriptors()
        for _ in range(50):  # what each prefix costs each new dataset: an attachment, dropped
            probe = prefix.SharedMemory(name, False)
            assert bytes(probe.buf[:4]) == b"\0\0\0\0"
            del probe
        gc.collect()
        assert _open_descriptors() <= before + 2  # streaming's own class would hold 50 x 2 more
        kept = SharedMemory(name, False)  # streaming's class, unchanged outside the prefix search
        gc.collect()
        assert _open_descriptors() > before
        kept.cleanup()
    finally:
        segment.cleanup()
