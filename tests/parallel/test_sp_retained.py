"""FS-L under sequence parallelism fetches only its retained cells: the right cells, gradients
back to their owners, and received bytes that do not grow with N (real gloo ranks)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.parallel.ranks import run_ranks

WORKER = Path(__file__).with_name("_retained_worker.py")


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_fsl_fetch_is_its_cells_and_constant_in_n():
    outputs = run_ranks(WORKER, 4, "4", "96,384,1536")
    counts = {}
    for line in "".join(outputs).splitlines():
        m = re.match(r"bytes N=(\d+) rank=(\d+) forward=(\d+) total=(\d+) all_gather=(\d+) relayed=(\d+) "
                     r"to_earlier=(\d+)", line)
        if m:
            counts[int(m[1]), int(m[2])] = tuple(int(x) for x in m.groups()[2:])
    assert len(counts) == 12
    # B=2 rows x H=3 heads x (P=3 cells of 4 + a 12-position halo) x 2d=10 fp32; fewer when some of
    # the top-P cells lie in the halo (each cell travels once)
    fetch, halo = 2 * 3 * (3 * 4 + 12) * 10 * 4, 2 * 3 * 12 * 10 * 4
    candidates = 3 * 2 * 2 * 3 * 3 * 8  # 3 other ranks x (values, cells) x B x H x P, float64
    for n in (384, 1536):  # every rank after the first has more than P cells before its halo
        for rank in range(4):
            forward, total, gathered, _, _ = counts[n, rank]
            assert (halo <= forward <= fetch if rank else forward == 0) and gathered == candidates
            assert total <= fetch * 4  # its own fetch plus three other ranks' gradients at most
    assert counts[96, 1][0] < fetch  # a short prefix: its halo and all of its few cells
    assert counts[1536, 0][3] > 0  # the checks above ran with cells sent by relays
    assert counts[1536, 0][4] > 0  # some sent by a rank after their target (the last rank evens the load)
