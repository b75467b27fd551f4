"""One rank of the FS-L retained-cells check: what `retained_kv` fetches and what it costs.

Usage: python _retained_worker.py SP N[,N...]
For each N, against a plain reference built from the all-gathered prefix on this rank:
1. the fetched prefix is the halo plus, per (batch, head), the top-P cells of the rest by
   `a_c` (earlier cell first on ties), zero elsewhere, and equals the gathered keys there;
2. gradients reach the owners: those of a weighted sum over the fetched positions equal the
   all-gather path's with the same weights;
3. the bytes received per rank in the forward are `P s + h` positions per head plus the
   candidates' all-gather, the same for every N whose prefix holds more than `P` cells;
   the backward returns gradients of the cells later ranks fetched, at most as many; some cells
   come from relays (the worker prints how many, and how many a relay after its target sent),
   whose gradients go back through them.
Prints one `bytes N=... rank=...` line per N; exits non-zero on a mismatch.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from fsframework.models.context import RetainedCells
from fsframework.ops.freesolo_routing import cell_summaries
from fsframework.parallel.attention import gather_kv
from fsframework.parallel.collectives import CommCounter
from fsframework.parallel.context import SPContext
from fsframework.parallel.groups import init_groups
from fsframework.parallel.cell_relays import balance
from fsframework.parallel.retained import _candidates, _plan, halo_width, retained_kv
from tests.parallel.ranks import finish_rank

SPAN = RetainedCells(cell_size=4, recent_cells=2, retained_cells=3, window=10)  # halo: 3 cells


def expected_cells(k_prefix: torch.Tensor, low: int) -> torch.Tensor:
    """Reference: bool `[B, H, C]`, C = low / s: the cells before `low` among the top-P of the whole
    prefix by `a_c`, by a plain stable sort."""
    a = cell_summaries(k_prefix, SPAN.cell_size)[1].transpose(1, 2)  # B H C_prefix
    order = a.argsort(dim=-1, descending=True, stable=True)[..., :SPAN.retained_cells]
    top = torch.zeros_like(a, dtype=torch.bool).scatter_(-1, order, True)
    return top[..., : low // SPAN.cell_size]


def check(n: int, sp: SPContext) -> list[str]:
    sp = sp.at_length(n)
    gen = torch.Generator().manual_seed(n)
    k_all, v_all = (torch.randn(2, n, 3, 5, generator=gen) for _ in range(2))
    weight = torch.randn(2, n, 3, 10, generator=gen)
    own = [t[:, sp.start:sp.end].clone().requires_grad_(True) for t in (k_all, v_all)]
    with CommCounter.counting() as counted:
        k, v = retained_kv(*own, sp, SPAN)
        forward = dict(counted)
        a, s = sp.start, SPAN.cell_size
        low = max(0, a - halo_width(SPAN))
        keep = torch.zeros(2, a, 3, dtype=torch.bool)
        keep[:, low:] = True
        keep[:, :low] = expected_cells(k_all[:, :a], low).transpose(1, 2).repeat_interleave(s, dim=1)
        mask = torch.cat((keep, torch.ones(2, sp.end - a, 3, dtype=torch.bool)), dim=1)[..., None]
        (torch.cat((k, v), dim=-1) * weight[:, :sp.end] * mask).sum().backward()
    errors = []
    got = torch.cat((k, v), dim=-1).detach()
    want = torch.cat((k_all, v_all), dim=-1)[:, :sp.end] * mask
    if not torch.equal(got, want):
        errors.append(f"N={n}: the fetched prefix is not the halo plus the top-P cells")
    grads = [t.grad.clone() for t in own]
    ref = [t.detach().clone().requires_grad_(True) for t in own]
    kr, vr = gather_kv(*ref, sp)
    (torch.cat((kr, vr), dim=-1) * weight[:, :sp.end] * mask).sum().backward()
    for name, g, r in zip("kv", grads, ref):
        if not torch.allclose(g, r.grad, rtol=1e-6, atol=1e-6):
            errors.append(f"N={n}: the gradient of the own {name} differs from the all-gather path's")
    plan = balance(_plan(*_candidates(own[0].detach(), sp, SPAN), sp, SPAN), sp.size)
    cells = ("cells", "relayed cells")  # from owners, from relays
    print(f"bytes N={n} rank={sp.rank} forward={sum(forward.get(c, 0) for c in cells)} "
          f"total={sum(counted.get(c, 0) for c in cells)} "
          f"all_gather={counted['all_gather']} relayed={sum(len(r) for r in plan.relayed.values())} "
          f"to_earlier={sum(len(r) for (m, t), r in plan.relayed.items() if m > t)}")
    return errors


def main() -> None:
    sp_size, lengths = int(sys.argv[1]), [int(x) for x in sys.argv[2].split(",")]
    dist.init_process_group("gloo")
    sp = SPContext(groups=init_groups(sp_size), block_size=8)
    finish_rank([e for n in lengths for e in check(n, sp)], sp.rank)


if __name__ == "__main__":
    main()
