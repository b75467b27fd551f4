"""FS's earlier keys under sequence parallelism: route from gathered cell summaries, fetch only the selected cells.

Legend: B batch, n own queries at `[start, end)`, H heads, d head width (keys and values
travel concatenated, `2d`), s cell size, w window, C cells.

FS routing (docs/freesolo.md §1.3-§1.4) reads only the cell summaries (mean key `kbar_c`,
largest key norm `a_c`), each query then reads only the tokens of its top-K cells, and the
local window the `w` keys before it. So a rank does not all-gather the prefix
(docs/architecture.md, "What a sequence-parallel rank receives and why"); per layer call:

1. summaries: every rank summarizes the complete cells of its own keys and all-gathers
   them (`C x H x (d + 1)` floats per rank, about `1/(2s)` of its keys and values), and
   routes its queries from the summaries of `[0, end)`, as one process would from the keys
   (`select_cells_from_summaries` with the layer's settings and prior; the same numbers, so the same cells);
2. requests: the earlier cells some own query selected, plus the window's halo (the whole
   cells covering the `w` positions before `start`), per (batch row, head), minus the
   cells the rank holds itself, all-gathered as (row, head, cell) triples, so every rank
   plans every fetch alike: from the owner, or relayed by another rank that fetched the
   cell from it too (`fsframework.parallel.cell_relays`, as for FS-L);
3. fetch: the cells travel point to point (`retained.FetchCells` on this plan), and the
   backward returns each cell's gradient to its owner (through its relay).

The keys handed to the layer cover `[0, end)`: zero outside the fetched cells and the
positions the rank holds (the FreeSolo ops read keys by position; routing never reads
these keys, it has the summaries). Under the zigzag layout a rank's second run is a second
call of the same layer: its prefix also holds the first runs of every rank, so the rank
keeps its own first-run keys and the first call's summaries for it (`SelectedCells`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from fsframework.models.context import CellRouter
from fsframework.ops.freesolo import select_cells_from_summaries, summarize_cells
from fsframework.parallel.cell_relays import CellPlan, balance
from fsframework.parallel.collective_time import SP_COLLECTIVES
from fsframework.parallel.collectives import CommCounter, num_bytes
from fsframework.parallel.context import SPContext
from fsframework.parallel.compact import Held, cells_read, compact_keys
from fsframework.parallel.retained import FetchCells

Summaries = tuple[torch.Tensor, torch.Tensor]  # kbar [B, H, C, d], a [B, H, C]


def gather_summaries(own: Summaries, sp: SPContext, ranges: list[tuple[int, int]], s: int,
                     before: Summaries | None = None) -> Summaries:
    """Every rank's summaries of its range in `ranges` (one per rank, together `[L, M)`), after
    `before` (those of `[0, L)`) -> the summaries of the complete cells of `[0, M)`. One all-gather
    of `kbar` and `a` side by side, padded to the most cells a rank has."""
    kbar, a = own
    counts = [(hi - lo) // s for lo, hi in ranges]
    mine = torch.cat((kbar, a[..., None].to(kbar.dtype)), dim=-1)  # B H c d+1
    chunk = torch.cat((mine, mine.new_zeros((*mine.shape[:2], max(counts) - mine.shape[2], mine.shape[3]))), dim=2)
    every = [torch.empty_like(chunk) for _ in range(sp.size)]
    with SP_COLLECTIVES.timing(chunk.device):
        dist.all_gather(every, chunk, group=sp.group)
    CommCounter.add("summaries", (sp.size - 1) * num_bytes(chunk))
    total = max(hi for _, hi in ranges) // s
    out = chunk.new_zeros((*chunk.shape[:2], total, chunk.shape[3]))
    if before is not None:
        out[:, :, : before[0].shape[2]] = torch.cat((before[0], before[1][..., None].to(before[0].dtype)), dim=-1)
    for part, count, (lo, _) in zip(every, counts, ranges):
        out[:, :, lo // s: lo // s + count] = part[:, :, :count]
    return out[..., :-1], out[..., -1].to(a.dtype)


def wanted_rows(cells: torch.Tensor, start: int, tail: int, s: int, held: Held,
                have: torch.Tensor | None = None) -> torch.Tensor:
    """(row, head, cell) `[m, 3]` of the cells before `start` that this call reads and does not hold:
    those some query selected (cells `[B, n, H, K]`) and the window's halo (the cells of
    `[tail, start)`), less the rank's own positions (`held`) and the rows it fetched already
    (`have`, an earlier run's)."""
    wanted = cells_read(cells, start // s)
    wanted[:, :, tail // s:] = True  # the local window reads the w keys before start
    for lo, hi in held:
        if lo < start:
            wanted[:, :, lo // s: min(hi, start) // s] = False  # own keys: no fetch
    if have is not None:
        wanted[have[:, 0], have[:, 1], have[:, 2]] = False
    return wanted.nonzero()


def request_cells(rows: torch.Tensor, sp: SPContext, held: list[Held], s: int) -> CellPlan:
    """This rank's wanted rows -> the plan of every rank's fetches, the same on every rank: the
    requests are all-gathered (a count per rank, then the rows, padded: 12 bytes a cell against
    the cell's `s x 2d` values), so each owner knows what to send and the cells that other ranks
    also fetched can be relayed to even out what the ranks receive (`cell_relays.balance`).
    `held[r]`: the ranges rank `r` holds in this call (together they tile the sequence so far)."""
    count = torch.tensor([len(rows)], device=rows.device)
    counts = [torch.empty_like(count) for _ in range(sp.size)]
    with SP_COLLECTIVES.timing(count.device):
        dist.all_gather(counts, count, group=sp.group)
    counts = [int(c) for c in counts]
    padded = torch.cat((rows.int(), rows.new_zeros((max(counts) - len(rows), 3), dtype=torch.int32)))
    every = [torch.empty_like(padded) for _ in range(sp.size)]
    with SP_COLLECTIVES.timing(padded.device):
        dist.all_gather(every, padded, group=sp.group)
    CommCounter.add("requests", (sp.size - 1) * (num_bytes(count) + num_bytes(padded)))
    pieces = sorted((lo, r) for r, ranges in enumerate(held) for lo, _ in ranges)
    lows = torch.tensor([lo for lo, _ in pieces], device=rows.device)
    ranks = torch.tensor([r for _, r in pieces], device=rows.device)
    direct = {}
    for target, (wanted, num) in enumerate(zip(every, counts)):
        wanted = wanted[:num].long()
        owners = ranks[torch.bucketize(wanted[:, 2] * s, lows, right=True) - 1]
        for owner in owners.unique().tolist():
            direct[(owner, target)] = wanted[owners == owner]
    return balance(direct, sp.size)


@dataclass
class _Kept:
    """What a layer call's first run leaves its second (zigzag): the own keys and values, the summaries
    gathered so far, and the cells it fetched (rows and values, with their autograd history)."""

    own: list[torch.Tensor] = field(default_factory=list)
    summaries: Summaries | None = None
    rows: torch.Tensor | None = None
    fetched: torch.Tensor | None = None


class SelectedCells:
    """FS's keys for the calls of one layer on one rank: a call per own run (one under the
    contiguous layout, two under zigzag), in run order. Between the calls of a layer it keeps
    what the first leaves the second (`_Kept`): the rank's earlier run's keys and values (it
    serves their cells to the later call and reads them itself), the summaries gathered so far
    and the cells the first call fetched (the second fetches only the cells it lacks)."""

    def __init__(self, sp: SPContext):
        self.sp = sp
        self.kept: dict[int, _Kept] = {}  # layer -> what its earlier run left

    def keys(self, run: int, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             router: CellRouter) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Own run `run`'s q, k, v `[B, n, H, d]` -> compact keys and values (the cells the queries read,
        the window's halo, the own keys: `fsframework.parallel.compact`) and the queries' cells
        `[B, n, H, K]` indexing them."""
        sp, settings = self.sp, router.settings
        s = settings.cell_size
        start, end = sp.runs[run]
        kept = self.kept.pop(layer, _Kept()) if run else _Kept()
        kv = torch.cat((k, v), dim=-1)  # B n H 2d
        summaries = gather_summaries(summarize_cells(k, settings), sp, [runs[run] for runs in sp.all_runs], s,
                                     kept.summaries)
        kbar, a = summaries
        cells = select_cells_from_summaries(q, kbar[:, :, : end // s], a[:, :, : end // s], settings, router.prior,
                                            q_start=start)
        held = [runs[: run + 1] for runs in sp.all_runs]
        tail = max(0, start - settings.window) // s * s  # the window's halo starts here, in whole cells
        wanted = wanted_rows(cells, start, tail, s, held[sp.rank], kept.rows)
        plan = request_cells(wanted, sp, held, s)
        fetched = FetchCells.apply(torch.cat(kept.own + [kv], dim=1), sp, plan, s, held[sp.rank])
        received = plan.rows_of(sp.rank)
        rows = torch.cat(received) if received else torch.zeros((0, 3), dtype=torch.long, device=k.device)
        if kept.rows is not None:  # the earlier run's cells: compact_keys keeps those this run reads
            rows, fetched = torch.cat((rows, kept.rows)), torch.cat((fetched, kept.fetched))
        if run + 1 < len(sp.runs):
            self.kept[layer] = _Kept(kept.own + [kv], summaries, rows, fetched)
        compact, cells = compact_keys(kv, fetched, rows, cells, list(zip(sp.runs[:run], kept.own)), start, tail, s)
        return compact[..., : k.shape[-1]], compact[..., k.shape[-1]:], cells
