"""Block-aligned slices, group layout and clear errors (no process groups needed)."""

from __future__ import annotations

import pytest

from fsframework.parallel.sharding import block_slices, causal_work, layout_runs


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


@pytest.mark.parametrize("seq, sp, block", [(100, 2, 16), (200, 4, 16), (4096, 8, 128), (131072, 4, 128)], ids=str)
def test_zigzag_runs_cover_the_sequence_in_whole_blocks(seq, sp, block):
    runs = layout_runs(seq, sp, block, "zigzag")
    assert all(len(r) == 2 for r in runs)
    flat = sorted(run for r in runs for run in r)
    assert flat[0][0] == 0 and flat[-1][1] == seq and all(a[1] == b[0] for a, b in zip(flat, flat[1:]))
    assert all(start % block == 0 for start, _ in flat)
    # rank r holds runs r and 2 sp - 1 - r of the 2 sp runs in position order
    assert [r[0] for r in runs] == flat[:sp] and [r[1] for r in runs] == flat[sp:][::-1]


def test_zigzag_balances_causal_work_and_contiguous_does_not():
    """Counted score elements per rank at N = 32k, sp = 4 (work guard of the layouts)."""
    def ratio(layout):
        work = [causal_work(r) for r in layout_runs(32768, 4, 128, layout)]
        return max(work) / (sum(work) / len(work))

    assert ratio("zigzag") <= 1.1
    assert ratio("contiguous") > 1.7


def test_short_sequences_and_bad_layouts():
    assert layout_runs(37, 2, 16, "zigzag") == [[(0, 32)], [(32, 37)]]  # 3 blocks: no 4 runs, one slice each
    with pytest.raises(ValueError, match="sp_layout='ring' is not one of"):
        layout_runs(100, 2, 16, "ring")


def test_sp_layout_typo_is_a_clear_config_error():
    from fsframework.config import Config, ConfigError, validate

    cfg = Config()
    cfg.parallel.sp_layout = "zig-zag"
    with pytest.raises(ConfigError, match="parallel.sp_layout='zig-zag' is not allowed"):
        validate(cfg)
