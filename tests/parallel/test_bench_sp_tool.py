"""`tools/bench_sp.py` end to end on real CPU ranks (gloo) at toy sizes, as a user runs it: every table it
prints (bytes per layer, per-rank work; activation memory, wall time, activation checkpointing off / on),
with the figures its docstring promises. The bytes table follows from the shapes: one layer, H = 4, d = 32,
fp32, so a token's keys and values are 4 * 64 * 4 bytes."""

from __future__ import annotations

import json
import math
import re

import pytest

from tests.utils import run_tool

N, KV_BYTES_PER_TOKEN, WINDOW = 1024, 4 * 2 * 32 * 4, 512  # the default AttentionConfig's window
KINDS = ("fsl", "fs", "tfpp", "swa")


def section(stdout: str, title: str) -> list[str]:
    """The rows of the table under the heading that starts with `title` (its column header left out)."""
    return stdout.split(f"\n{title}", 1)[1].split("\n\n", 1)[0].splitlines()[2:]


@pytest.mark.ranks
def test_bytes_and_work_tables(tmp_path):
    """Each kind's own fetch against the all-gather under the zigzag layout (FS and FS-L: the FreeSolo
    layer's `freesolo_state`), and the layouts' per-rank work."""
    out = tmp_path / "records.json"
    proc = run_tool("bench_sp.py", "--only", "bytes", "work", "--n", str(N), "--sp", "2", "--kinds", *KINDS,
                    "--layout", "zigzag", "--json", str(out))
    records = json.loads(out.read_text())

    fetches = {(r["kind"], r["fetch"]): r for r in records if "fetch" in r}
    assert set(fetches) == {(kind, fetch) for kind in KINDS for fetch in ("all_gather", "kind")}
    gathered = N // 2 * KV_BYTES_PER_TOKEN  # the other rank's slice
    for kind in KINDS:
        before, after = fetches[kind, "all_gather"], fetches[kind, "kind"]
        assert (before["n"], before["sp"], before["layout"]) == (N, 2, "contiguous")
        assert after["layout"] == ("zigzag" if kind in ("fs", "tfpp") else "contiguous")  # the prefix kinds
        # all-gather forward, reduce-scatter backward; the gathered keys held, less the own
        assert before["bytes_received_per_layer"] == 2 * gathered
        assert before["forward_bytes_received_per_layer"] == before["gathered_key_bytes"] == gathered
        assert 0 < after["forward_bytes_received_per_layer"] <= after["bytes_received_per_layer"]
        assert 0 < after["mean_bytes_received_per_layer"] <= after["bytes_received_per_layer"]
        assert after["gathered_key_bytes"] >= 0
    assert fetches["tfpp", "kind"]["bytes_received_per_layer"] == 2 * gathered  # zigzag: the same bytes
    for kind in ("fs", "fsl", "swa"):  # selected cells, retained cells, the window's halo
        assert fetches[kind, "kind"]["bytes_received_per_layer"] < 2 * gathered
    swa = fetches["swa", "kind"]
    # per-rank maxima: rank 1 receives the halo, rank 0 the halo's gradient
    assert swa["bytes_received_per_layer"] == swa["mean_bytes_received_per_layer"] == WINDOW * KV_BYTES_PER_TOKEN
    assert swa["gathered_key_bytes"] == WINDOW * KV_BYTES_PER_TOKEN  # the halo's keys and values, nothing else
    table = [line.split() for line in section(proc.stdout, "2. bytes received")]
    assert [(row[0], row[1], row[2]) for row in table] == [(kind, str(N), "2") for kind in KINDS]

    # per-rank work, max over mean: >= 1 for each count and layout; zigzag balances both
    work = {(r["work"], r["layout"]): r["max_over_mean"] for r in records if "work" in r}
    assert set(work) == {(w, layout) for w in ("causal", "fs_routing") for layout in ("contiguous", "zigzag")}
    for name in ("causal", "fs_routing"):
        assert 1 <= work[name, "zigzag"] < work[name, "contiguous"]


@pytest.mark.ranks
def test_memory_time_and_recompute_tables():
    """The tables that run the whole model (d_model 256, 4 layers) on sp = 1 and 2 ranks, zigzag layout; they
    share its runs (4 launches)."""
    n = 512
    proc = run_tool("bench_sp.py", "--only", "memory", "time", "recompute", "--n", str(n), "--sp", "2",
                    "--kind", "tfpp")

    # activation memory: one row per rank of sp = 1 and 2, each rank's zigzag runs; less per rank at sp = 2
    memory = [line.split() for line in section(proc.stdout, "1. activation memory")]
    assert [row[:3] for row in memory] == [["1", "0", "[0,512)"], ["2", "0", "[0,128)+[384,512)"],
                                           ["2", "1", "[128,256)+[256,384)"]]
    saved = [float(row[3]) for row in memory]
    assert all(float(row[4]) > 0 for row in memory)  # peak RSS
    assert 0 < max(saved[1:]) < saved[0]

    # wall time and CPU time of a step, sp = 1 against sp = 2
    wall = re.search(r"wall: sp=1 ([\d.]+) s, sp=2 ([\d.]+) s", proc.stdout)
    cpu = re.search(r"CPU time of the busiest rank: sp=1 ([\d.]+) s, sp=2 ([\d.]+) s", proc.stdout)
    assert wall and cpu and all(float(x) > 0 for x in (*wall.groups(), *cpu.groups()))

    # activation checkpointing: "off" is the memory table's count; "on" keeps the blocks' inputs only
    rows = [line.split() for line in section(proc.stdout, "4. activation memory")]
    assert [row[:3] for row in rows] == [[str(n), "1", "0"], [str(n), "2", "0"], [str(n), "2", "1"]]
    assert [float(row[3]) for row in rows] == saved
    assert all(0 < float(row[4]) < float(row[3]) for row in rows)


@pytest.mark.ranks
def test_bytes_and_work_tables_with_document_masking(tmp_path):
    """`--documents none one mix`: the unmasked tables keep their records (documents `none`); with masking a
    rank receives the layer's input at the W positions before its continued piece (one row: `W D` numbers;
    SWA: at most its window), beside the kind's own unmasked fetch; AR-GRC per forward. One document per row
    is the unmasked row, so its per-rank work is the unmasked work; masked zigzag is balanced."""
    out = tmp_path / "records.json"
    kinds = ("tfpp", "swa", "fsl", "argrc")
    proc = run_tool("bench_sp.py", "--only", "bytes", "work", "--n", str(N), "--sp", "2", "--kinds", *kinds,
                    "--documents", "none", "one", "mix", "--json", str(out))
    records = json.loads(out.read_text())
    assert {r["documents"] for r in records} == {"none", "one", "mix"}
    # the unmasked table as before; AR-GRC has no keys to fetch: it is in the masked table only
    unmasked = {(r["kind"], r["fetch"]) for r in records if r["documents"] == "none" and "fetch" in r}
    assert unmasked == {(kind, fetch) for kind in kinds[:-1] for fetch in ("all_gather", "kind")}

    masked = {(r["kind"], r["documents"]): r for r in records if r.get("fetch") == "halo"}
    assert set(masked) == {(kind, docs) for kind in kinds for docs in ("one", "mix")}
    width_bytes = KV_BYTES_PER_TOKEN // 2  # a layer's input: D = 4 x 32 fp32 numbers per position, B = 1
    for (kind, docs), r in masked.items():
        assert (r["n"], r["sp"], r["layout"], r["per"]) == (N, 2, "contiguous",
                                                            "forward" if kind == "argrc" else "layer")
        assert r["rank"] == 1  # the rank after the boundary receives; rank 0 only the gradient, in backward
        assert 0 < r["halo_width"] <= N // 2  # `one`: the whole first slice
        reach = min(r["halo_width"], WINDOW) if kind == "swa" else r["halo_width"]
        if kind == "argrc":  # the roots of the earlier part's aligned blocks (D numbers each), not its leaves
            root_bytes = width_bytes
            assert 0 < r["forward_bytes_received_per_layer"] < reach * width_bytes
            assert r["forward_bytes_received_per_layer"] % root_bytes == 0
        else:
            assert r["forward_bytes_received_per_layer"] == r["bytes_received_per_layer"] == reach * width_bytes
        assert r["unmasked_forward_bytes_received_per_layer"] > 0
        assert r["masked_over_unmasked"] == pytest.approx(
            r["forward_bytes_received_per_layer"] / r["unmasked_forward_bytes_received_per_layer"])
    assert masked["argrc", "one"]["masked_over_unmasked"] == 1  # one document over both slices: one root, as unmasked
    assert masked["tfpp", "one"]["halo_width"] == N // 2
    assert masked["tfpp", "one"]["unmasked_forward_bytes_received_per_layer"] == N // 2 * KV_BYTES_PER_TOKEN
    assert masked["tfpp", "one"]["masked_over_unmasked"] == 0.5  # inputs are half the bytes of keys and values
    rows = [line.split() for line in section(proc.stdout, "2b. bytes received")]
    assert [(row[0], row[1], row[2], row[4]) for row in rows] == [(kind, str(N), "2", docs) for kind in kinds
                                                                  for docs in ("one", "mix")]

    # per-rank work, max over mean: finite; one document per row is the unmasked contiguous row
    work = {(r["work"], r["layout"], r["documents"]): r for r in records if "work" in r}
    counts = ("causal", "fs_routing")
    assert set(work) == {(w, layout, docs) for w in counts for layout in ("contiguous", "zigzag")
                         for docs in ("none", "one", "mix")}
    for name in counts:
        for layout in ("contiguous", "zigzag"):
            unmasked = work[name, layout, "none"]["max_over_mean"]
            for docs in ("one", "mix"):
                r = work[name, layout, docs]
                assert math.isfinite(r["max_over_mean"]) and r["max_over_mean"] >= 1
                assert r["unmasked_max_over_mean"] == unmasked
            assert work[name, layout, "one"]["work_over_unmasked"] == 1
        assert work[name, "contiguous", "one"]["max_over_mean"] == work[name, "contiguous", "none"]["max_over_mean"]
        # masked zigzag deals its chunks by the documents' work: balanced for one document, and no worse than
        # contiguous slices for the mix (at this N a chunk is one block: tests/parallel/test_sharding.py holds
        # the 10% bound at realistic sizes)
        assert work[name, "zigzag", "one"]["max_over_mean"] < 1.1
        assert work[name, "zigzag", "mix"]["max_over_mean"] <= work[name, "contiguous", "mix"]["max_over_mean"]
        assert 0 < work[name, "contiguous", "mix"]["work_over_unmasked"] < 1  # documents cut the causal square
