"""Sequence-parallel fetch schemes for FreeSolo FS, measured on CPU ranks (gloo): bytes and held keys.

    python tools/bench_sp_fs.py                                   # N = 8k, 32k, 128k; sp = 2, 4, 8
    python tools/bench_sp_fs.py --n 8192 32768 --sp 2 4 --keys random peaked --json OUT

Under sequence parallelism a rank holds the queries, keys and values of its contiguous slice
`[a, b)` and needs earlier keys from the ranks before it. FS routing (docs/freesolo.md
§1.3-§1.6) reads only the cell summaries (mean key `kbar_c`, largest key norm `a_c`), each
query then reads only the tokens of its top-K cells, and the local window reads the `w`
keys before it; gradients reach only those keys and values. Three ways to fetch them:

- `all_gather` (what every prefix kind does today, `fsframework.parallel.attention.gather_kv`):
  one all-gather of every rank's keys and values, a reduce-scatter of their gradients.
- `selected`: an all-gather of the cell summaries only (`C_own x H x (d + 1)` floats per
  rank), routing on the rank itself, then a request round (point to point: how many cells,
  then which (batch row, head, cell)) to each earlier owner of the union of the cells its
  queries selected plus the window halo (whole cells covering the `w` positions before
  `a`); the owners send those cells (`s` positions x `2d` floats of one row and head) and the
  backward returns each fetched cell's gradient to its owner (FS-L's
  `fsframework.parallel.retained.FetchCells`, with this rank's requests as its plan).
- `ring`: every rank's key/value block travels the ring `sp - 1` hops, each rank forwarding
  the block it received last, so at most two blocks are held at once; in the backward the
  blocks go round again together with their gradient accumulators (the gradient of a key
  needs the key, which was not kept), and one more hop takes each accumulator home.
  Every rank forwards every block (as Ring Attention does): a causal ring that stops a block
  once no later rank reads it sends less in total but as much to the last rank, the busiest.

For each N, sp and key variant it counts, per rank, with `CommCounter` on the real collectives
of one layer's forward + backward (B = 1, H = 4, d = 32, fp32, the default `AttentionConfig`):
the bytes received; the bytes of other ranks' keys and values held at once in the forward pass
(kept for the backward; the backward holds as much gradient again): the gathered prefix, the
fetched cells plus the earlier ranks' summaries, or the ring's two blocks (one at sp = 2); and
for `selected` the fraction of earlier-rank cells (per row and head) that some own query
selected. Key variants: `random` (randn keys, routing at random init) and `peaked` (the keys of
a random 5% of the cells times 3, so the norm prior `lam * a_c * erf(...)` draws the routing to
them).
Printed: per-rank maxima (under `selected` the busiest rank may be an early owner receiving the
gradients of its cells), the ratio to `all_gather`; `--json OUT` writes one record per row, with
the per-rank figures.

The routing is computed from the gathered summaries with `route_candidates`, the same steps as
`select_cells`; at the smallest N each worker asserts, against the all-gathered keys, that the
routing equals `select_cells(..., impl="reference")`, that the fetched cells equal the gathered
ones, that the gradients of a weighted sum of the fetched cells equal those of the same sum
over the all-gathered prefix, and that the ring returns each block's gradient to its owner.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from fsframework.config import AttentionConfig
from fsframework.models.freesolo_settings import fs_config, fs_prior
from fsframework.ops.freesolo import select_cells
from fsframework.ops.freesolo_routing import cell_summaries, route_candidates
from fsframework.parallel.attention import gather_kv
from fsframework.parallel.cell_relays import CellPlan
from fsframework.parallel.collectives import CommCounter, exchange, num_bytes
from fsframework.parallel.context import SPContext
from fsframework.parallel.groups import init_groups
from fsframework.parallel.compact import cells_of
from fsframework.parallel.retained import FetchCells

sys.path.insert(0, str(Path(__file__).parent))  # the tools' shared launcher, also when loaded by path
from launch_ranks import launch  # noqa: E402
SCHEMES = ("all_gather", "selected", "ring")
KEY_VARIANTS = ("random", "peaked")
HEADS, HEAD_DIM = 4, 32
PEAKED_SHARE, PEAKED_SCALE = 0.05, 3.0


# ---------------------------------------------------------------------------------------------
# one rank: inputs


def own_inputs(sp, n: int, keys: str, cell_size: int):
    """This rank's q, k, v `[1, b - a, H, d]` (randn; drawn per rank, so no rank builds all N).

    `peaked`: the same draws, with the keys of a random 5% of all cells (the same cells on
    every rank) times 3."""
    a, b = sp.span
    gen = torch.Generator().manual_seed(1000 * n + sp.rank)
    q, k, v = (torch.randn(1, b - a, HEADS, HEAD_DIM, generator=gen) for _ in range(3))
    if keys == "peaked":
        cells = n // cell_size
        chosen = torch.randperm(cells, generator=torch.Generator().manual_seed(n))[: round(PEAKED_SHARE * cells)]
        own = chosen[(chosen * cell_size >= a) & ((chosen + 1) * cell_size <= b)] - a // cell_size
        pos = (own[:, None] * cell_size + torch.arange(cell_size)).flatten()
        k[:, pos] *= PEAKED_SCALE
    return q, k, v


# ---------------------------------------------------------------------------------------------
# the `selected` scheme


def gather_summaries(k, sp, cell_size: int):
    """Every rank's cell summaries in position order: kbar `[1, C, H, d]`, a `[1, C, H]`, C the cells of
    `[0, N)` (one all-gather of `kbar` and `a` side by side, padded to the longest slice)."""
    kbar, norm = cell_summaries(k, cell_size)
    mine = torch.cat((kbar, norm[..., None]), dim=-1)  # 1 C_own H d+1
    counts = [(e - s) // cell_size for s, e in sp.slices]
    chunk = torch.cat((mine, mine.new_zeros((1, max(counts) - mine.shape[1], *mine.shape[2:]))), dim=1)
    every = [torch.empty_like(chunk) for _ in range(sp.size)]
    dist.all_gather(every, chunk, group=sp.group)
    CommCounter.add("summaries", (sp.size - 1) * num_bytes(chunk))
    summaries = torch.cat([part[:, :count] for part, count in zip(every, counts)], dim=1)
    return summaries[..., :-1].contiguous(), summaries[..., -1].contiguous()  # the layout select_cells scores


def route_from_summaries(q, kbar, norm, q_start: int, att):
    """FS routing of this rank's queries (`select_cells`' `_route_fs` steps) from summaries alone ->
    cells `[1, n, H, K]`, -1 where fewer than K cells are eligible."""
    s, block = att.cell_size, att.block_size
    kbar_h, norm_h = kbar.transpose(1, 2), norm.transpose(1, 2).contiguous()  # 1 H C d, 1 H C
    centers = (torch.arange(kbar.shape[1], dtype=kbar.dtype) + 0.5) * s
    out = torch.full((*q.shape[:3], att.top_k), -1, dtype=torch.long)
    end = q_start + q.shape[1]
    for start in range(max(block, q_start), end, block):  # a query sees the cells complete before its block
        num, rows = start // s, slice(start - q_start, min(start + block, end) - q_start)
        out[:, rows] = route_candidates(q[:, rows], start, kbar_h[:, :, :num], norm_h[:, :, :num], centers[:num],
                                        None, fs_prior(sigma=att.sigma, lam=att.lam), att.top_k)
    return out


def wanted_cells(cells, sp, att):
    """(wanted, selected_fraction): bool `[1, H, a / s]`, the earlier-rank cells this rank fetches per row
    and head: those some own query selected, and the window halo; the fraction counts the former."""
    s, a = att.cell_size, sp.start
    earlier = a // s
    wanted = torch.zeros((cells.shape[0], cells.shape[2], earlier), dtype=torch.bool)
    picked = (cells >= 0) & (cells < earlier)
    row, _, head, _ = picked.nonzero(as_tuple=True)
    wanted[row, head, cells[picked]] = True
    fraction = wanted.float().mean().item() if earlier else 0.0
    wanted[:, :, max(0, a - att.window) // s:] = True  # the local window reads the w keys before a
    return wanted, fraction


def request_cells(wanted, sp, cell_size: int):
    """(requests, serving): `[(owner, rows)]` the cells this rank asks each earlier owner for and
    `[(target, rows)]` those later ranks ask of it, rows (row, head, cell) long `[m, 3]`. Two point-to-point
    rounds: the counts (an owner cannot size its buffers without them), then the cells."""
    rows = wanted.nonzero()  # (row, head, cell), cell order within each (row, head)
    ends = torch.tensor([e for _, e in sp.slices])
    owners = torch.bucketize(rows[:, 2] * cell_size, ends, right=True)
    mine = {o: rows[owners == o] for o in range(sp.rank)}
    later = range(sp.rank + 1, sp.size)
    counts = [(t, torch.empty(1, dtype=torch.long)) for t in later]
    exchange(sp, [(o, torch.tensor([len(r)])) for o, r in mine.items()], counts, "requests")
    asked = [(t, torch.empty((int(c), 3), dtype=torch.int32)) for t, c in counts if int(c)]
    requests = [(o, r) for o, r in mine.items() if len(r)]
    exchange(sp, [(o, r.int()) for o, r in requests], asked, "requests")
    return requests, [(t, r.long()) for t, r in asked]


def run_selected(q, k, v, sp, att, weights_seed: int) -> dict:
    """The `selected` scheme's forward + backward on a weighted sum of the fetched cells (counted)."""
    with CommCounter.counting() as counted:
        kbar, norm = gather_summaries(k, sp, att.cell_size)
        cells = route_from_summaries(q, kbar, norm, sp.start, att)
        wanted, fraction = wanted_cells(cells, sp, att)
        requests, serving = request_cells(wanted, sp, att.cell_size)
        # FS-L's fetch, with the plan this rank's request round made: what it asks of each owner, what it serves
        plan = CellPlan({**{(o, sp.rank): rows for o, rows in requests}, **{(sp.rank, t): rows for t, rows in serving}})
        fetched = FetchCells.apply(torch.cat((k, v), dim=-1), sp, plan, att.cell_size)
        weights = torch.randn(fetched.shape, generator=torch.Generator().manual_seed(weights_seed))
        (fetched * weights).sum().backward()
    earlier_summaries = sp.start // att.cell_size * HEADS * (HEAD_DIM + 1) * kbar.element_size()
    rows = torch.cat([r for _, r in requests]) if requests else torch.zeros((0, 3), dtype=torch.long)
    return {"bytes": dict(counted), "held": num_bytes(fetched) + earlier_summaries, "fraction": fraction,
            "cells": cells, "rows": rows, "fetched": fetched.detach(), "weights": weights}


# ---------------------------------------------------------------------------------------------
# the `all_gather` and `ring` schemes


def run_all_gather(k, v, sp, rows, weights, cell_size: int) -> dict:
    """Today's fetch (`gather_kv`), forward + backward on the same weighted sum as `run_selected`'s, placed
    at the fetched cells' positions of the gathered prefix (the bytes do not depend on the sum)."""
    a, d = sp.start, k.shape[-1]
    dense = torch.zeros((1, a, HEADS, 2 * d))
    pos = rows[:, 2:] * cell_size + torch.arange(cell_size)
    dense.index_put_((rows[:, :1], pos, rows[:, 1:2]), weights, accumulate=True)
    with CommCounter.counting() as counted:
        gk, gv = gather_kv(k, v, sp)
        wk, wv = dense.split(d, dim=-1)
        ((gk[:, :a] * wk).sum() + (gv[:, :a] * wv).sum()).backward()
    held = gk.untyped_storage().nbytes() - 2 * k.numel() * k.element_size()  # k and v share one storage
    return {"bytes": dict(counted), "held": held, "gathered": (gk.detach(), gv.detach())}


def run_ring(kv, sp) -> dict:
    """The `ring` scheme's messages (no attention math): forward `sp - 1` hops of key/value blocks;
    backward `sp - 1` hops of (block, gradient accumulator), then the accumulators' hop home. Each rank
    adds `rank + 1` to the accumulator of every earlier rank's block it holds, so the gradient an owner
    gets back is known: the sum of `r + 1` over the ranks r after it."""
    me, width = sp.rank, kv.shape[-1]
    after, before = (me + 1) % sp.size, (me - 1) % sp.size
    longest = max(e - s for s, e in sp.slices)  # blocks travel padded to one size, as the all-gather's do
    block = torch.cat((kv.detach(), kv.new_zeros((kv.shape[0], longest - kv.shape[1], *kv.shape[2:]))), dim=1)
    held, peak = block, 0
    with CommCounter.counting() as counted:
        for hop in range(sp.size - 1):
            incoming = torch.empty_like(held)
            exchange(sp, [(after, held)], [(before, incoming)], "ring")
            peak = max(peak, num_bytes(incoming) + (num_bytes(held) if hop else 0))  # the own block is not counted
            held = incoming  # the attention reads it here; the block before it is dropped
        carry = torch.cat((block, torch.zeros_like(block)), dim=-1)  # block | its gradient accumulator
        for hop in range(sp.size - 1):
            incoming = torch.empty_like(carry)
            exchange(sp, [(after, carry)], [(before, incoming)], "ring_grads")
            carry = incoming
            if (me - hop - 1) % sp.size < me:  # own queries read the keys of earlier ranks only
                carry[..., width:] += me + 1
        home = torch.empty_like(block)
        exchange(sp, [(after, carry[..., width:])], [(before, home)], "ring_grads")
    expected = sum(r + 1 for r in range(me + 1, sp.size))
    return {"bytes": dict(counted), "held": peak, "returned_ok": bool((home[:, :kv.shape[1]] == expected).all())}


# ---------------------------------------------------------------------------------------------
# one rank: every configuration of the spec


def check_selected(q, sp, att, selected: dict, gathered: tuple, grads: dict) -> None:
    """The `selected` scheme against the all-gathered keys (at the smallest N): the same routing as
    `select_cells`, the same cells, the same gradients."""
    gk, gv = gathered
    config = fs_config("fs", cell_size=att.cell_size, block_size=att.block_size, top_k=att.top_k, impl="reference")
    reference = select_cells(q, gk, config, fs_prior(sigma=att.sigma, lam=att.lam), q_start=sp.start)
    assert torch.equal(reference, selected["cells"]), "routing from summaries differs from select_cells"
    expected = cells_of(torch.cat((gk, gv), dim=-1), selected["rows"], 0, att.cell_size)
    assert torch.equal(expected, selected["fetched"]), "fetched cells differ from the gathered ones"
    for name in ("k", "v"):
        assert torch.allclose(grads["selected"][name], grads["all_gather"][name], rtol=1e-5, atol=1e-6), (
            f"grad {name}: selected differs from all_gather")


def worker(spec: dict) -> None:
    """One rank: every (N, key variant) of `spec`, the three schemes, one JSON line of records."""
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    att = AttentionConfig()
    base = SPContext(groups=init_groups(dist.get_world_size()), block_size=att.block_size)
    records, checked = [], []
    for n in spec["n"]:
        sp = base.at_length(n)
        for keys in spec["keys"]:
            q, k, v = own_inputs(sp, n, keys, att.cell_size)
            grads, start = {}, time.perf_counter()
            leaves = [x.clone().requires_grad_(True) for x in (k, v)]
            selected = run_selected(q, *leaves, sp, att, weights_seed=n + 7 * sp.rank)
            grads["selected"] = {"k": leaves[0].grad, "v": leaves[1].grad}
            leaves = [x.clone().requires_grad_(True) for x in (k, v)]
            gathered = run_all_gather(*leaves, sp, selected["rows"], selected["weights"], att.cell_size)
            grads["all_gather"] = {"k": leaves[0].grad, "v": leaves[1].grad}
            ring = run_ring(torch.cat((k, v), dim=-1), sp)
            seconds = time.perf_counter() - start  # routing dominates: it is the readout's, not a fetch's, work
            if n == min(spec["n"]):
                check_selected(q, sp, att, selected, gathered["gathered"], grads)
                assert ring["returned_ok"], "the ring did not return every block's gradient to its owner"
                checked.append((n, keys))
            for scheme, result in (("all_gather", gathered), ("selected", selected), ("ring", ring)):
                records.append({"n": n, "keys": keys, "scheme": scheme, "bytes": sum(result["bytes"].values()),
                                "by_collective": result["bytes"], "held": result["held"],
                                "fraction": result.get("fraction"), "seconds": seconds})
            del selected, gathered, ring, grads, leaves
    print(json.dumps({"rank": dist.get_rank(), "span": list(base.at_length(spec["n"][0]).span),
                      "checked": checked, "records": records}))
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# the table


def table(lengths: list[int], sps: list[int], keys: list[str]) -> list[dict]:
    print("bytes received per layer (fwd + bwd) and other ranks' keys/values held in the forward pass, per rank "
          f"maxima; FS, B=1, H={HEADS}, d={HEAD_DIM}, fp32, one layer, default AttentionConfig")
    print(f"{'N':>7} {'sp':>3} {'keys':>7} {'scheme':>11} {'recv MB':>9} {'/ all_gather':>12} "
          f"{'held MB':>8} {'/ all_gather':>12} {'selected':>9}")
    out = []
    for sp in sps:
        start = time.perf_counter()
        ranks = launch(sp, {"n": lengths, "keys": keys}, __file__)
        wall = time.perf_counter() - start
        for n in lengths:
            for variant in keys:
                rows = {scheme: [{**rec, "rank": r["rank"]} for r in ranks for rec in r["records"]
                                 if (rec["n"], rec["keys"], rec["scheme"]) == (n, variant, scheme)]
                        for scheme in SCHEMES}
                base_bytes = max(r["bytes"] for r in rows["all_gather"])
                base_held = max(r["held"] for r in rows["all_gather"])
                for scheme in SCHEMES:
                    recv, held = max(r["bytes"] for r in rows[scheme]), max(r["held"] for r in rows[scheme])
                    fraction = max(r["fraction"] for r in rows[scheme]) if scheme == "selected" else None
                    shown = f"{fraction:>9.3f}" if fraction is not None else f"{'':>9}"
                    print(f"{n:>7} {sp:>3} {variant:>7} {scheme:>11} {recv / 1e6:>9.2f} {recv / base_bytes:>12.3f} "
                          f"{held / 1e6:>8.2f} {held / base_held:>12.3f} {shown}")
                    by_rank = sorted(rows[scheme], key=lambda r: r["rank"])
                    out.append({"kind": "fs", "scheme": scheme, "n": n, "sp": sp, "keys": variant,
                                "bytes_received_per_layer": recv, "gathered_key_bytes": held,
                                "selected_fraction": fraction,
                                # which rank is the busiest, and on what: early owners receive gradients
                                "bytes_per_rank": [r["bytes"] for r in by_rank],
                                "by_collective_per_rank": [r["by_collective"] for r in by_rank],
                                "held_per_rank": [r["held"] for r in by_rank],
                                "fraction_per_rank": [r["fraction"] for r in by_rank]})
        slowest = max((rec["seconds"], rec["n"], rec["keys"]) for r in ranks for rec in r["records"])
        print(f"  (sp={sp}: {wall:.0f} s wall, the slowest rank's slowest configuration {slowest[0]:.0f} s at "
              f"N={slowest[1]} {slowest[2]}; selected checked against all_gather at {ranks[0]['checked']})")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, nargs="+", default=[8192, 32768, 131072], help="sequence lengths")
    parser.add_argument("--sp", type=int, nargs="+", default=[2, 4, 8], help="sequence-parallel sizes")
    parser.add_argument("--keys", nargs="+", choices=KEY_VARIANTS, default=list(KEY_VARIANTS))
    parser.add_argument("--json", help="write the records to this file")
    args = parser.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    records = table(args.n, args.sp, args.keys)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
