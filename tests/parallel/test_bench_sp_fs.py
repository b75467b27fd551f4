"""tools/bench_sp_fs.py on three real ranks at small N: its workers run their own checks (the `selected`
fetch's routing, cells and gradients against the all-gather, the ring's returned gradients), and it
gives one record per (key variant, scheme) whose all-gather and ring bytes follow from the slice sizes."""

from __future__ import annotations


import pytest

from tests.utils import load_tool

HEADS, HEAD_DIM, FP32 = 4, 32, 4


@pytest.mark.ranks
def test_bench_sp_fs_records():
    # 2048 tokens over 3 ranks: slices of 6, 5 and 5 query blocks, so blocks and summaries are padded;
    # the middle rank both fetches cells and serves them
    records = {(r["keys"], r["scheme"]): r for r in load_tool("bench_sp_fs.py").table([2048], [3], ["random", "peaked"])}
    assert set(records) == {(keys, scheme) for keys in ("random", "peaked")
                            for scheme in ("all_gather", "selected", "ring")}
    block = 6 * 128 * HEADS * 2 * HEAD_DIM * FP32  # the longest slice's keys and values
    for keys in ("random", "peaked"):
        gather, ring, selected = (records[keys, scheme] for scheme in ("all_gather", "ring", "selected"))
        assert gather["bytes_received_per_layer"] == 2 * 2 * block  # all-gather + reduce-scatter, 2 peers
        assert ring["bytes_received_per_layer"] == (3 * 3 - 2) * block  # 2 hops, 2 with gradients, 1 home
        assert 0 < selected["selected_fraction"] <= 1
        assert 0 < selected["bytes_received_per_layer"] < gather["bytes_received_per_layer"]
        assert selected["fraction_per_rank"][0] == 0.0  # the first rank has no earlier cells
