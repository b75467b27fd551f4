"""Block-aligned slices, group layout and clear errors (no process groups needed)."""

from __future__ import annotations

import pytest

from fsframework.parallel.sharding import block_slices


@pytest.mark.parametrize("seq, sp, block", [(100, 2, 16), (100, 4, 16), (4096, 8, 128), (129, 2, 128), (63, 2, 16)])
def test_slices_are_contiguous_whole_blocks_and_balanced(seq, sp, block):
    slices = block_slices(seq, sp, block)
    assert slices[0][0] == 0 and slices[-1][1] == seq
    assert all(a[1] == b[0] for a, b in zip(slices, slices[1:]))
    assert all(start % block == 0 for start, _ in slices)
    blocks = [-(-(end - start) // block) for start, end in slices]
    assert max(blocks) - min(blocks) <= 1 and blocks == sorted(blocks, reverse=True)


def test_too_few_blocks_is_a_clear_error():
    with pytest.raises(ValueError, match="fewer than parallel.sp=4"):
        block_slices(40, 4, 16)
