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


def _document_work(positions, runs) -> list[int]:
    """Causal score elements of each rank's queries read within their documents (query at p: p + 1 keys)."""
    return [sum(int((positions[:, a:b] + 1).sum()) for a, b in own) for own in runs]


@pytest.mark.parametrize("sp", [2, 4, 8])
def test_document_runs_balance_masked_work_where_zigzag_does_not(sp):
    """Rows of packed documents read apart: `document_runs` keeps every rank's causal work within 10% of the
    mean on one long document per row (where it deals zigzag's pairs) and on rows of mixed lengths, where
    zigzag's fixed pairs leave a rank far above it; every position is held once, every rank holds as many
    chunks, and the runs are a function of the rows (every rank computes the same)."""
    import random

    import torch

    from fsframework.models.documents import document_positions
    from fsframework.parallel.sharding import document_runs

    n, block = 16384, 128
    rng = random.Random(sp)
    mixed = []
    while len(mixed) < n:  # exponential lengths, mean n / 8, ids changing at each document
        mixed += [len(mixed) and mixed[-1] + 1] * max(1, round(rng.expovariate(8 / n)))
    rows = {"one": torch.zeros(1, n, dtype=torch.long), "mix": torch.tensor([mixed[:n]])}
    ratio = {}
    for name, doc_ids in rows.items():
        positions = document_positions(doc_ids)
        runs = document_runs(positions, sp, block)
        assert runs == document_runs(positions.clone(), sp, block)
        flat = sorted(run for own in runs for run in own)
        assert flat[0][0] == 0 and flat[-1][1] == n and all(a[1] == b[0] for a, b in zip(flat, flat[1:]))
        assert len({sum(b - a for a, b in own) for own in runs}) == 1  # 4 chunks of n / 4 sp tokens each
        work = _document_work(positions, runs)
        zigzag = _document_work(positions, layout_runs(n, sp, block, "zigzag"))
        ratio[name] = max(work) * sp / sum(work), max(zigzag) * sp / sum(zigzag)
        assert ratio[name][0] < 1.1, (name, ratio[name])
    assert ratio["one"][1] < 1.1  # one document per row: zigzag balances too
    assert ratio["mix"][1] > 1.2  # zigzag's fixed pairs on these mixed rows: 1.30 / 1.72 / 1.53 at sp 2 / 4 / 8
