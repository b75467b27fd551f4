"""Who sends each fetched cell of FS and FS-L: its owner, or another rank that already holds it.

Legend: sp ranks, rows `(b, h, cell)` `[m, 3]` long (one cell of one batch row and head),
o owner (the rank whose slice holds the cell), t target (the rank that reads it), m relay.

`fsframework.parallel.retained` (FS-L) and `fsframework.parallel.selected` (FS) fetch, for
every target `t`, earlier cells that other ranks hold. If every owner sends its own cells, an owner
also receives the gradient of each of its cells once per later rank that read it: FS-L's
middle ranks, which fetch `P` cells and serve every later rank, receive the most, the first
rank only gradients, the last rank only its fetches.

Any rank that received a cell straight from its owner can serve it to another target: it
forwards the cell in a second round, and in the backward sums the target's gradient into
its own before returning it to the owner. The owner then receives one gradient for both,
the relay one more. The relay may come before the target or after it: the last rank, which
serves no cell of its own, takes gradients off the owners that way (retention is monotone,
docs/freesolo.md §1.5, so a later rank's top-`P` holds an earlier rank's best cells: FS-L's
last rank holds many cells its predecessors read). Every rank computes the same plan from
the all-gathered candidates or requests:

1. direct: every cell from its owner (`retained._plan`, `selected.request_cells`);
2. load per rank = cells it receives in the forward (fixed) + gradients it receives in the
   backward (one per cell it sends);
3. repeatedly, the busiest rank hands cells it sends to a target over to the least busy other
   rank that received them straight from it, half the difference in load at most, while that
   lowers the busiest rank's load. A cell that sources a relay is never relayed to its relay
   itself, so two rounds always suffice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

Pair = tuple[int, int]


@dataclass
class CellPlan:
    """`direct[(owner, target)]`: rows sent by their owner (round 1); `relayed[(relay, target)]`:
    rows sent by a relay (round 2) and `sources[(relay, target)]`, each row's index in the relay's
    round-1 receipts (`receipts(relay)`, owners in order)."""

    direct: dict[Pair, torch.Tensor]
    relayed: dict[Pair, torch.Tensor] = field(default_factory=dict)
    sources: dict[Pair, torch.Tensor] = field(default_factory=dict)

    def sent_by(self, rank: int, relayed: bool = False) -> list[tuple[int, torch.Tensor]]:
        """(target, rows) this rank sends in round 1 (own cells) or round 2 (relayed), targets in order."""
        table = self.relayed if relayed else self.direct
        return [(t, rows) for (s, t), rows in sorted(table.items()) if s == rank]

    def received_by(self, rank: int, relayed: bool = False) -> list[tuple[int, torch.Tensor]]:
        """(sender, rows) this rank receives in round 1 or round 2, senders in order."""
        table = self.relayed if relayed else self.direct
        return [(s, rows) for (s, t), rows in sorted(table.items()) if t == rank]

    def rows_of(self, rank: int) -> list[torch.Tensor]:
        """Every row this rank receives, in the order of its fetched cells: round 1, then round 2."""
        return [rows for _, rows in self.received_by(rank) + self.received_by(rank, relayed=True)]

    def loads(self, size: int) -> list[int]:
        """Cells each rank receives per step: its fetches (forward) and one gradient per cell it sends."""
        load = [0] * size
        for table in (self.direct, self.relayed):
            for (s, t), rows in table.items():
                load[t] += len(rows)
                load[s] += len(rows)
        return load


def _keys(rows: torch.Tensor, heads: int, cells: int) -> torch.Tensor:
    return (rows[:, 0] * heads + rows[:, 1]) * cells + rows[:, 2]


class _Balancer:
    """Step 3 of the module docstring over `direct` rows (alive/pinned masks per pair)."""

    def __init__(self, direct: dict[Pair, torch.Tensor], size: int):
        self.direct, self.size = direct, size
        rows = torch.cat(list(direct.values())) if direct else torch.zeros((1, 3), dtype=torch.long)
        self.heads, self.cells = int(rows[:, 1].max()) + 1, int(rows[:, 2].max()) + 1  # to key rows uniquely
        self.alive = {p: torch.ones(len(r), dtype=torch.bool) for p, r in direct.items()}  # still sent directly
        self.pinned = {p: torch.zeros(len(r), dtype=torch.bool) for p, r in direct.items()}  # sources a relay
        self.moved: dict[tuple[int, int, int], list[torch.Tensor]] = {}  # (owner, relay, target) -> direct row indices
        self._match: dict[tuple[int, int, int], torch.Tensor] = {}
        self.load = CellPlan(direct).loads(size)

    def match(self, owner: int, target: int, relay: int) -> torch.Tensor:
        """For each row of direct[(owner, target)], its index in direct[(owner, relay)], -1 if absent."""
        key = (owner, target, relay)
        if key not in self._match:  # direct[(owner, relay)] exists (`movable` asks only then) and is not empty
            want = _keys(self.direct[(owner, target)], self.heads, self.cells)
            have = _keys(self.direct[(owner, relay)], self.heads, self.cells)
            order = have.argsort()
            pos = torch.searchsorted(have[order], want).clamp(max=len(have) - 1)
            self._match[key] = torch.where(have[order][pos] == want, order[pos], -1)
        return self._match[key]

    def movable(self, owner: int, target: int, relay: int) -> torch.Tensor:
        """Rows of direct[(owner, target)] that `relay` can forward: still direct and unpinned here,
        received straight from `owner` by `relay`."""
        if (owner, relay) not in self.direct:
            return torch.zeros(0, dtype=torch.long)
        at = self.match(owner, target, relay)
        ok = self.alive[(owner, target)] & ~self.pinned[(owner, target)] & (at >= 0)
        still_there = torch.zeros_like(ok)
        still_there[ok] = self.alive[(owner, relay)][at[ok]]  # not itself relayed to `relay`
        return (ok & still_there).nonzero().flatten()

    def step(self) -> bool:
        """One hand-over from the busiest rank; False when none lowers its load."""
        busiest = max(range(self.size), key=lambda r: (self.load[r], -r))
        relays = sorted((m for m in range(self.size) if m != busiest), key=lambda m: (self.load[m], m))
        for relay in relays:
            room = (self.load[busiest] - self.load[relay]) // 2
            if room < 1:
                break
            for target in range(self.size):
                if target == relay or (busiest, target) not in self.direct:
                    continue
                rows = self.movable(busiest, target, relay)[:room]
                if len(rows):
                    self.alive[(busiest, target)][rows] = False
                    self.pinned[(busiest, relay)][self.match(busiest, target, relay)[rows]] = True
                    self.moved.setdefault((busiest, relay, target), []).append(rows)
                    self.load[busiest] -= len(rows)
                    self.load[relay] += len(rows)
                    return True
        return False

    def plan(self) -> CellPlan:
        while self.step():
            pass
        direct = {p: rows[self.alive[p]] for p, rows in self.direct.items() if bool(self.alive[p].any())}
        plan = CellPlan(direct)
        for relay in range(self.size):
            # the relay's round-1 receipts, owners in order, as `CellPlan.received_by` lists them
            offsets, total = {}, 0
            for (o, t), rows in sorted(direct.items()):
                if t == relay:
                    offsets[o], total = total, total + len(rows)
            index_in_alive = {o: torch.cumsum(self.alive[(o, relay)].long(), 0) - 1 for o in offsets}
            for target in range(self.size):
                rows, sources = [], []
                for owner in sorted(offsets):
                    picked = self.moved.get((owner, relay, target))
                    if not picked:
                        continue
                    picked = torch.cat(picked).sort().values
                    rows.append(self.direct[(owner, target)][picked])
                    at = self.match(owner, target, relay)[picked]
                    sources.append(offsets[owner] + index_in_alive[owner][at])
                if rows:
                    plan.relayed[(relay, target)] = torch.cat(rows)
                    plan.sources[(relay, target)] = torch.cat(sources)
        return plan


def balance(direct: dict[Pair, torch.Tensor], size: int) -> CellPlan:
    """The direct plan with cells handed to relays where that lowers the busiest rank's load.
    Planned on the CPU (a few thousand rows, many small steps); the rows come back on their device."""
    device = next(iter(direct.values())).device if direct else torch.device("cpu")
    plan = _Balancer({p: rows.cpu() for p, rows in direct.items()}, size).plan()
    return CellPlan(*({p: t.to(device) for p, t in table.items()}
                      for table in (plan.direct, plan.relayed, plan.sources)))
