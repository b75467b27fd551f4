"""FS-B routing (docs/freesolo.md §1.8): beam search over two forests, then Eq. 12 rescoring.

Reference implementation in plain PyTorch; inference only (no gradient). The search (`beam_search`)
has a Triton kernel (`fsf_kernels.fsb_search`: one launch for a window of query blocks, `search_states`,
instead of tens of small ops per tree level and block), picked by `impl` as every op's
(`fsframework.ops.dispatch`); the forests' growth and the rescoring stay in PyTorch.
Legend: Bt batch, N tokens, H heads, d head width, Q queries of one block, Wb beam
width, K top_k, s cell size.

Per batch row and head, two forests (rows of `fsframework.ops.fsb_forest.Forests`) grow at
every query-block boundary with the newly eligible cells: `F0` admits every cell,
`Ftau` the cells with `a_c >= tau_h`. For the queries of a block, a beam starts at
each root; at each level the beam keeps its leaves (never evicted) and fills the
other `Wb - |leaves|` slots with the children of its inner nodes of largest

    U_v = (q . mu_v + c * rho_v * ||q||) / sqrt(d) + lam_h * A_v * erf((i - pmin_v) / (2 sigma_h))

(ties: smaller `pmin_v`), until only leaves remain. `U_v` bounds Eq. 7's score of
every cell below `v` when `c >= 1`. The union of both beams' cells is rescored by

    R_ic = logsumexp_{j in cell c}(q_i . k_j / sqrt(d)) + lam_h * a_c * erf((i - p_c) / (2 sigma_h))

and the top-K (ties: earlier cell) are read (§1.6). Search costs `O(Wb log M d)` per
query. Rescoring computes a block's log-sum-exps once, for the union `U` of its queries'
candidates (`|U| <= min(C, B * 2 Wb)`: a per-query cost bounded independently of N).
With `Wb` at least the number of admitted cells the beam never drops a node, so the
result is the exact top-K of Eq. 12.

Every batch row, head and forest is grown and searched at once: their forests are the rows
of one `Forests` (`[G, capacity, ...]` buffers), admission is batched over them
(`admit_cells`), and the search holds one beam tensor `[G, Q, Wb]`.

The per-block steps take and return FS-B's state (`FSBState`: the forests and their
thresholds): `admit_fsb` at a block boundary, `route_fsb_block` for a block's queries; a decode
state (`fsframework.ops.fsb_decode`) calls them as its blocks arrive. `select_cells_fsb` knows
every block's cells up front: it builds the forests of all blocks at once
(`fsframework.ops.fsb_states`, the same nodes) and searches and rescores block by block.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from fsf_kernels.common.args import check_first_cells, check_routing_args
from fsf_kernels.common.support import fsb_search_unsupported
from fsframework.ops.dispatch import kernel_for
from fsframework.ops.freesolo_config import FreeSoloConfig, RoutingPrior
from fsframework.ops.freesolo_routing import cell_summaries, query_blocks, top_k_earliest
from fsframework.ops.fsb_forest import Forests, NodeStore
from fsframework.ops.fsb_states import forest_states

FORESTS = ("both", "f0", "ftau")
# the forests of each choice, in row order: None = F0 (admits every cell), "tau" = Ftau (a_c >= tau_h)
FOREST_KINDS = {"both": (None, "tau"), "f0": (None,), "ftau": ("tau",)}


def check_fsb_args(tau: torch.Tensor | None, heads: int, *, beam_width: int, top_k: int, bound_c: float,
                   forests: str) -> None:
    """FS-B's own arguments; raise ValueError naming the problem."""
    if forests not in FORESTS:
        raise ValueError(f"forests must be one of {FORESTS}, got {forests!r}")
    if beam_width < top_k:
        raise ValueError(f"beam_width={beam_width} must be >= top_k={top_k} (a beam of Wb leaves per forest is "
                         "all the rescoring sees)")
    if not math.isfinite(bound_c) or bound_c < 0:
        raise ValueError(f"bound_c must be a finite number >= 0 (>= 1 makes U_v an upper bound), got {bound_c}")
    if forests == "f0":
        return
    if tau is None:
        raise ValueError("FS-B needs tau, the per-head key-norm threshold of Ftau (a [H] tensor; `fsf calibrate` "
                         "computes it for a checkpoint), unless forests='f0'")
    if not isinstance(tau, torch.Tensor) or tuple(tau.shape) != (heads,):
        shape = tuple(tau.shape) if isinstance(tau, torch.Tensor) else type(tau).__name__
        raise ValueError(f"tau must be a tensor of shape ({heads},), one threshold per head, got {shape}")
    if not bool(torch.isfinite(tau).all()):
        raise ValueError(f"tau must be finite, got {tau.tolist()}")


def _take(buffer: torch.Tensor, nodes: torch.Tensor, starts: torch.Tensor | None = None) -> torch.Tensor:
    """`buffer [G, cap, ...]` at node ids `nodes [G, Q, m]` (entries < 0 read node 0: mask them);
    `starts`: each row's first flat index, `[G, 1, 1]` (`_row_starts`), when the caller keeps it."""
    groups, capacity, *rest = buffer.shape
    if starts is None:
        starts = _row_starts(groups, capacity, nodes.device)
    flat = starts + nodes.clamp_min(0)
    return buffer.reshape(groups * capacity, *rest).index_select(0, flat.flatten()).view(*nodes.shape, *rest)


def _row_starts(groups: int, capacity: int, device: torch.device) -> torch.Tensor:
    return torch.arange(0, groups * capacity, capacity, device=device)[:, None, None]


def forest_thresholds(tau: torch.Tensor | None, heads: int, batch: int, kinds: tuple, *,
                      like: torch.Tensor) -> torch.Tensor:
    """Admission threshold of every forest row `[batch * heads * len(kinds)]`, rows ordered (batch
    row, head, kind): `-inf` for `F0` (kind None: every cell), `tau_h` for `Ftau` (kind "tau")."""
    per_kind = [torch.full((heads,), float("-inf"), dtype=like.dtype, device=like.device) if kind is None
                else tau.detach().to(like) for kind in kinds]
    return torch.stack(per_kind, dim=-1).repeat(batch, 1).flatten()


def admit_cells(forests: Forests, kbar: torch.Tensor, a: torch.Tensor, centers: torch.Tensor, ids: torch.Tensor,
                thresholds: torch.Tensor) -> None:
    """One block boundary: every forest row admits the newly eligible cells `ids [n]` whose `a_c`
    reaches its threshold. kbar `[G, n, d]`, a `[G, n]` per (batch row, head) g, centers `[n]`;
    the forest rows are g's rows, one per kind (`forest_thresholds`)."""
    kbar_rows, a_rows, keep = _forest_rows(kbar, a, thresholds)
    forests.admit(kbar_rows, a_rows, centers, ids, keep)


def _forest_rows(kbar: torch.Tensor, a: torch.Tensor,
                 thresholds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Summaries per (batch row, head) g, kbar `[G, n, d]`, a `[G, n]` -> the forest rows' (one per
    kind, `forest_thresholds`): kbar `[G kinds, n, d]`, a and the cells each row admits `[G kinds, n]`."""
    kinds = thresholds.numel() // kbar.shape[0]
    a_rows = a.repeat_interleave(kinds, dim=0)
    return kbar.repeat_interleave(kinds, dim=0), a_rows, a_rows >= thresholds[:, None]


# `_union` marks values in a mask over their range while the range is at most this many times the
# entries (cheaper than a sort on a CPU), and sorts the entries beyond: either way O(entries) per row
UNION_MASK_SPAN = 4


def _union(cand: torch.Tensor, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the distinct values of `cand [G, L]` in `[0, pad]` (`pad` = none), ascending and padded
    with `pad` to the widest row, `[G, U]`, and each entry's place in its row's union `[G, L]` (pads:
    any place, clamped in range). A mask over the values' range while it is short (`UNION_MASK_SPAN`),
    else a sort of the `L` entries: never a pass over a range (the cells, the forests' nodes) that
    grows with the context while the entries do not."""
    groups, entries = cand.shape
    if pad <= UNION_MASK_SPAN * entries:
        present = cand.new_zeros((groups, pad + 1), dtype=torch.bool).scatter_(1, cand, True)[:, :pad]
        width = max(int(present.sum(dim=1).max()), 1)
        place = present.long().cumsum(dim=1) - 1  # a present value's place in its row's union
        union = cand.new_full((groups, width + 1), pad).scatter_(
            1, torch.where(present, place, width), torch.arange(pad, device=cand.device).expand(groups, -1))
        return union[:, :width], place.gather(1, cand.clamp_max(pad - 1)).clamp(0, width - 1)
    flat = cand.sort(dim=1).values
    new = flat < pad
    new[:, 1:] &= flat[:, 1:] != flat[:, :-1]
    width = max(int(new.sum(dim=1).max()), 1)
    union = cand.new_full((groups, width + 1), pad).scatter_(
        1, torch.where(new, new.long().cumsum(dim=1) - 1, width), flat)[:, :width].contiguous()
    return union, torch.searchsorted(union, cand).clamp_max(width - 1)


# a search step scores the block's distinct nodes as one matmul when there are at most this many
# times as many as the (query, child) pairs' nodes per query (the upper levels, where the queries of
# a block share their nodes); otherwise each pair gathers its node: either way O(Q Wb d) per step
DISTINCT_NODES_PER_CHILD = 2


def _node_dots(mu: torch.Tensor, q: torch.Tensor, nodes: torch.Tensor, starts: torch.Tensor | None = None):
    """`q . mu_v` `[G, Q, m]` of node ids `nodes [G, Q, m]` (entries < 0 give garbage). The block's
    distinct nodes come from a sort of its `Q m` ids (`_union`), not a pass over the store."""
    groups, num_q, width = nodes.shape
    capacity = mu.shape[1]
    if num_q > 1:
        ids, slot = _union(torch.where(nodes >= 0, nodes, capacity).flatten(1), capacity)
        distinct = ids.shape[1]
        if distinct <= DISTINCT_NODES_PER_CHILD * width:
            # pads (capacity) read the row's last node, which no entry maps to
            dots = torch.bmm(q, _take(mu, ids[:, None].clamp_max(capacity - 1), starts)[:, 0].transpose(1, 2))
            return dots.gather(2, slot.view_as(nodes))  # G Q m
    return torch.matmul(_take(mu, nodes, starts), q[..., None])[..., 0]


class _Terms(NamedTuple):
    """What `U_v` reads of the queries and rows, computed once per search: q `[G, Q, d]`, pos
    `[1, Q, 1]`, `c ||q||` `[G, Q, 1]`, lam and `2 sigma` `[G, 1, 1]`, `sqrt(d)`, and the rows'
    first flat node indices (`_row_starts`)."""

    q: torch.Tensor
    pos: torch.Tensor
    c_qnorm: torch.Tensor
    lam: torch.Tensor
    two_sigma: torch.Tensor
    scale: float
    starts: torch.Tensor


def _terms(store: NodeStore, q: torch.Tensor, pos: torch.Tensor, lam: torch.Tensor, sigma: torch.Tensor,
           bound_c: float) -> _Terms:
    c_qnorm = bound_c * torch.linalg.vector_norm(q, dim=-1, keepdim=True)
    return _Terms(q, pos[None, :, None], c_qnorm, lam[:, None, None], 2.0 * sigma[:, None, None],
                  math.sqrt(q.shape[-1]), _row_starts(store.rows, store.capacity, q.device))


def _bounds_and_pmin(store: NodeStore, terms: _Terms, nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rho, amax, pmin = _take(store.buffers["stats"], nodes, terms.starts).unbind(-1)  # G Q m each
    content = _node_dots(store.buffers["mu"], terms.q, nodes, terms.starts) + rho * terms.c_qnorm
    gate = torch.erf((terms.pos - pmin) / terms.two_sigma)
    return content / terms.scale + terms.lam * amax * gate, pmin


def node_bounds(store: NodeStore, q: torch.Tensor, pos: torch.Tensor, nodes: torch.Tensor, *, lam: torch.Tensor,
                sigma: torch.Tensor, bound_c: float) -> torch.Tensor:
    """`U_v` `[G, Q, m]` of node ids `nodes [G, Q, m]` (one forest per row of `store`; entries < 0
    give garbage: mask them) for queries q `[G, Q, d]` at positions `pos [Q]`; lam, sigma `[G]`."""
    return _bounds_and_pmin(store, _terms(store, q, pos, lam, sigma, bound_c), nodes)[0]


def _expand(links: torch.Tensor, beam: torch.Tensor, starts: torch.Tensor | None = None):
    """The beam's leaves `[..., Wb]` bool, its cells (-1 inside) and its inner nodes' children
    `[..., 2 Wb]` (-1 = none); None for the children once every node is a leaf."""
    node = _take(links, beam, starts)  # ... Wb 3: left, right, cell
    held, cells = beam >= 0, node[..., 2]
    leaf = held & (cells >= 0)
    inner = held & (cells < 0)
    if not bool(inner.any()):
        return leaf, cells, None
    return leaf, cells, torch.where(inner[..., None], node[..., :2], -1).flatten(-2)


def _fill(beam: torch.Tensor, leaf: torch.Tensor, ranked: torch.Tensor) -> torch.Tensor:
    """The next beam: the leaves stay in their slots, the other slots take `ranked`'s first nodes."""
    rank = (~leaf).long().cumsum(dim=-1) - 1  # a free slot's place among the free slots
    return torch.where(leaf, beam, ranked.gather(-1, rank.clamp_min(0)))


def _valid_first(children: torch.Tensor) -> torch.Tensor:
    """`children` with its valid nodes first (in their order), then -1: a compaction, no sort."""
    valid = children >= 0
    width = children.shape[-1]
    place = torch.where(valid, valid.long().cumsum(dim=-1) - 1, width)
    out = children.new_full((*children.shape[:-1], width + 1), -1)
    return out.scatter_(-1, place, children)[..., :width]


def _all_fit(leaf: torch.Tensor, children: torch.Tensor, beam_width: int) -> bool:
    return bool(((children >= 0).sum(dim=-1) <= beam_width - leaf.sum(dim=-1)).all())


def shared_walk(links: torch.Tensor, roots: torch.Tensor, beam_width: int) -> tuple:
    """The upper levels of every forest row, where every child fits and the beam takes them all
    whatever the query: (beam, leaf, cells, children) `[G, 1, ...]` where they stop (children
    None once every node is a leaf), for `beam_search` to go on from."""
    beam = torch.full((roots.shape[0], 1, beam_width), -1, dtype=torch.long, device=roots.device)
    beam[..., 0] = roots[:, None]
    starts = _row_starts(*links.shape[:2], roots.device)
    leaf, cells, children = _expand(links, beam, starts)
    while children is not None and _all_fit(leaf, children, beam_width):
        beam = _fill(beam, leaf, _valid_first(children))
        leaf, cells, children = _expand(links, beam, starts)
    return beam, leaf, cells, children


def _search_kernel(store: NodeStore, q: torch.Tensor, config: FreeSoloConfig, prior: RoutingPrior):
    """The search kernel (`fsf_kernels.fsb_search`) over `store` for queries q, as `config.impl` picks it,
    bound to everything but the roots and positions: `search(roots, pos, states=None)`; None where the
    reference searches."""
    kernel = kernel_for("fsb_search", "beam_search", config.impl, q,
                        fsb_search_unsupported(q.dtype, q.shape[-1], beam_width=config.beam_width))
    if kernel is None:
        return None
    buffers = store.buffers

    def search(roots: torch.Tensor, pos: torch.Tensor, states: torch.Tensor | None = None) -> torch.Tensor:
        return kernel(buffers["mu"], buffers["stats"], buffers["links"], roots, q, pos, beam_width=config.beam_width,
                      lam=prior.lam, sigma=prior.sigma, bound_c=config.bound_c, states=states)

    return search


def search_states(store: NodeStore, roots: torch.Tensor, q: torch.Tensor, pos: torch.Tensor,
                  segments: list[tuple[int, int, int]], config: FreeSoloConfig, prior: RoutingPrior) -> torch.Tensor:
    """`beam_search` of queries that read different states of the forests (`fsframework.ops.fsb_states`):
    roots `[G, J]`, q `[G, Q, d]` at `pos [Q]`, `segments` host triples `(state, lo, hi)` covering the
    queries: queries `[lo, hi)` search state `state`. The kernel searches them all in one launch (a
    window of query blocks, whatever documents they belong to); the reference, state by state."""
    kernel = _search_kernel(store, q, config, prior)
    if kernel is not None:
        states = torch.tensor([state for state, lo, hi in segments for _ in range(hi - lo)], dtype=torch.long)
        return kernel(roots, pos, states=states.to(q.device, non_blocking=True))
    found = q.new_full((*q.shape[:2], config.beam_width), -1, dtype=torch.long)
    for state, lo, hi in segments:
        found[:, lo:hi] = beam_search(store, roots[:, state], q[:, lo:hi], pos[lo:hi], config, prior)
    return found


def beam_search(store: NodeStore, roots: torch.Tensor, q: torch.Tensor, pos: torch.Tensor, config: FreeSoloConfig,
                prior: RoutingPrior, *, walks: dict | None = None) -> torch.Tensor:
    """Leaves reached by the beam of each query in each forest (Eq. 11): cells `[G, Q, Wb]`, -1 = none.
    With `config.impl` picking the kernel (`fsf_kernels.fsb_search`), the same cells per (row, query),
    in slots of its own (the slots are storage: the rescoring sorts them). Reads config's beam_width
    (Wb) and bound_c.

    roots `[G]` (-1: an empty forest), q `[G, Q, d]`, pos `[Q]`, the prior's lam, sigma `[G]`. A step keeps
    the beam's leaves in their slots and fills its other slots with the children of its inner
    nodes in order of `U_v` (ties: smaller `pmin_v`). The nodes a beam holds are disjoint
    subtrees, so their `pmin_v` differ and the order is total: slots are only storage.
    While every child fits (the upper levels) the beam takes them all whatever the query, so
    those levels are walked once per forest, not once per query (`shared_walk`), and once per
    state of the forests where `walks` keeps them (a dict per forests' state, keyed by beam width:
    a decoded block's tokens search the same forests).
    """
    beam_width, bound_c, lam, sigma = config.beam_width, config.bound_c, prior.lam, prior.sigma
    kernel = _search_kernel(store, q, config, prior)
    if kernel is not None:
        return kernel(roots, pos)
    links = store.buffers["links"]
    groups, num_q = q.shape[:2]
    walk = None if walks is None else walks.get(beam_width)
    if walk is None:
        walk = shared_walk(links, roots, beam_width)
        if walks is not None:
            walks[beam_width] = walk
    beam, leaf, cells, children = walk  # never written in place below: a kept walk stays valid
    if children is None:
        return torch.where(leaf, cells, -1).expand(groups, num_q, beam_width)
    beam, leaf, children = (x.expand(groups, num_q, x.shape[-1]) for x in (beam, leaf, children))
    terms = _terms(store, q, pos, lam, sigma, bound_c)
    while True:
        # every level is ranked, also one whose children all fit: the free slots then take them all
        key, pmin = _bounds_and_pmin(store, terms, children)
        key = key.masked_fill(children < 0, float("-inf"))
        # by U_v, equal bounds by pmin: a stable sort by U_v of the children in pmin order
        by_pmin = pmin.sort(dim=-1, stable=True).indices
        order = by_pmin.gather(-1, key.gather(-1, by_pmin).sort(dim=-1, descending=True, stable=True).indices)
        beam = _fill(beam, leaf, children.gather(-1, order))  # the invalid children last (-1)
        leaf, cells, children = _expand(links, beam, terms.starts)
        if children is None:
            return torch.where(leaf, cells, -1)


def rescore(q: torch.Tensor, keys: torch.Tensor, a: torch.Tensor, pos: torch.Tensor, cand: torch.Tensor,
            config: FreeSoloConfig, prior: RoutingPrior, *, scores_budget: int = 1 << 22) -> torch.Tensor:
    """Top-K cells of Eq. 12 among candidates `cand [G, Q, m]` (-1 pads, duplicates allowed) -> `[G, Q, K]`.

    Per row g (a batch row and head): q `[G, Q, d]` (one query block), the unrotated keys
    cell-major `[G, C', s, d]` (C' >= C: read in place), a `[G, C]` (read in place too: any
    strides); pos `[Q]`, the prior's lam, sigma `[G]`; cell c's center is `(c + 1/2) s`. Ties go to the
    earlier cell. The log-sum-exps are computed once per block for the union `U` of the block's
    candidates (`|U| <= min(C, Q m)`: a bounded `Q x |U| s` matmul, no per-query copy of keys), as
    many queries at a time as keep the token scores within `scores_budget` elements. Nothing here
    is a pass over the C cells: the union comes from sorting the `Q m` candidates, so a decoded
    token's rescoring costs the same at any context (tests/models/test_decode_work.py).
    """
    return rescore_blocks(q[:, None], keys, a, pos[None], cand[:, None], config, prior,
                          scores_budget=scores_budget)[:, 0]


# the keys of the candidates' unions that one rescoring step of `rescore_blocks` gathers, at most (a step
# holds at least one block, whatever its union)
RESCORE_KEYS_BUDGET = 1 << 24


def rescore_blocks(q: torch.Tensor, keys: torch.Tensor, a: torch.Tensor, pos: torch.Tensor, cand: torch.Tensor,
                   config: FreeSoloConfig, prior: RoutingPrior, *, scores_budget: int = 1 << 22,
                   keys_budget: int | None = None) -> torch.Tensor:
    """`rescore` of J query blocks at once: q `[G, J, Q, d]`, pos `[J, Q]`, cand `[G, J, Q, m]` -> `[G, J, Q, K]`.

    Each block keeps its own union of candidates (what its queries' log-sum-exps read: a union over
    many blocks would approach every cell), the unions padded to the widest of the blocks rescored
    together; consecutive blocks are taken as many at a time as keep the gathered keys within
    `keys_budget` elements (`RESCORE_KEYS_BUDGET`) and no union padded past the cells its block could
    name (one past its latest candidate), so no block reads more than its eligible cells and
    whole-sequence routing rescores a window of blocks in a few steps of a few ops each, not a hundred
    ops per block. A padded query (zero, candidates -1) selects nothing."""
    groups, blocks, num_q, dim = q.shape
    num_cells = a.shape[-1]
    budget = RESCORE_KEYS_BUDGET if keys_budget is None else keys_budget
    # ascending cell order with pads last (C), duplicates dropped: position order is cell order
    cand = torch.where(cand >= 0, cand, num_cells).sort(dim=-1).values
    valid = cand < num_cells
    valid[..., 1:] &= cand[..., 1:] != cand[..., :-1]
    if num_q == 1:  # a decoded token: its candidates are the union (pads and duplicates read, never picked)
        union, slot = cand[:, :, 0], torch.arange(cand.shape[-1], device=q.device).expand(groups, blocks, -1)
    else:
        union, slot = _union(torch.where(valid, cand, num_cells).flatten(2).flatten(0, 1), num_cells)
        union, slot = union.view(groups, blocks, -1), slot.view(groups, blocks, -1)
    widths, reach = [union.shape[-1]], [num_cells]
    if blocks > 1:
        # each block's widest union over the rows, and how many cells it could name (one past its latest
        # candidate, at most its eligible cells): one read for every block
        reach = torch.where(valid, cand + 1, 0).flatten(2).amax(dim=-1).amax(dim=0).clamp_min(1)
        widths, reach = torch.stack(((union < num_cells).sum(dim=-1).amax(dim=0).clamp_min(1), reach)).tolist()
    out = torch.empty((groups, blocks, num_q, config.top_k), dtype=torch.long, device=q.device)
    per_block = groups * keys.shape[2] * dim  # gathered key elements per cell of one block's union
    lo = 0
    while lo < blocks:
        # a step pads its blocks' unions to its widest, never past what any of them could name (so no
        # block reads more cells than its eligible ones: the work `fsframework.models.flops` bounds)
        hi, width, least = lo + 1, widths[lo], reach[lo]
        while (hi < blocks and (hi + 1 - lo) * max(width, widths[hi]) * per_block <= budget
               and max(width, widths[hi]) <= min(least, reach[hi])):
            width, least = max(width, widths[hi]), min(least, reach[hi])
            hi += 1
        out[:, lo:hi] = _rescore_step(q[:, lo:hi], keys, a, pos[lo:hi], cand[:, lo:hi], valid[:, lo:hi],
                                      union[:, lo:hi, :width], slot[:, lo:hi].clamp_max(width - 1), config, prior,
                                      scores_budget)
        lo = hi
    return out


def _rescore_step(q, keys, a, pos, cand, valid, union, slot, config: FreeSoloConfig, prior: RoutingPrior,
                  scores_budget: int) -> torch.Tensor:
    """Eq. 12 and top-K for the blocks of one `rescore_blocks` step: their sorted candidates `cand`, `valid`
    `[G, J, Q, m]`, unions `[G, J, U]` (C: none) and each candidate's place in its union `slot [G, J, Q m]`."""
    groups, blocks, num_q, dim = q.shape
    num_cells = a.shape[-1]
    cell_size, lam, sigma = config.cell_size, prior.lam, prior.sigma
    rows = torch.arange(groups, device=q.device)[:, None, None]
    picked = keys[rows, union.clamp_max(num_cells - 1)].to(q.dtype)  # G J U s d (pads read a cell no one uses)
    lse = torch.empty(groups, blocks, num_q, union.shape[-1], dtype=q.dtype, device=q.device)
    chunk = max(1, scores_budget // picked[..., 0].numel())
    for lo in range(0, num_q, chunk):
        hi = min(lo + chunk, num_q)
        lse[:, :, lo:hi] = (torch.einsum("gjqd,gjusd->gjqus", q[:, :, lo:hi], picked)
                            / math.sqrt(dim)).logsumexp(dim=-1)
    idx = cand.clamp_max(num_cells - 1)
    scores = lse.gather(-1, slot.view_as(cand))
    centers = (idx.to(q.dtype) + 0.5) * cell_size
    gate = torch.erf((pos[None, :, :, None] - centers) / (2.0 * sigma[:, None, None, None]))
    scores = scores + lam[:, None, None, None] * a[rows[..., None], idx] * gate
    choice = top_k_earliest(scores, valid, config.top_k)
    return torch.where(choice >= 0, cand.gather(-1, choice.clamp_min(0)), -1)


class FSBState(NamedTuple):
    """FS-B's routing state of one layer (docs/freesolo.md §1.8): tensors only.

    forests: one forest row per (batch row, head, kind), as `forest_thresholds` orders them;
    thresholds `[G * kinds]`: each row's admission threshold; walks: the search's query-independent
    upper levels per beam width (`shared_walk`), kept for the forests as they are. `start_fsb`
    makes an empty one, `admit_fsb` grows it at a block boundary, `route_fsb_block` reads it."""

    forests: Forests
    thresholds: torch.Tensor
    walks: dict


def start_fsb(tau: torch.Tensor | None, forests: str, batch: int, heads: int, dim: int, *,
              like: torch.Tensor) -> FSBState:
    """An FS-B state with no cell admitted; `like` gives the summaries' dtype and device."""
    kinds = FOREST_KINDS[forests]
    return FSBState(Forests(batch * heads * len(kinds), dim, dtype=like.dtype, device=like.device),
                    forest_thresholds(tau, heads, batch, kinds, like=like), {})


def admit_fsb(state: FSBState, kbar: torch.Tensor, a: torch.Tensor, centers: torch.Tensor,
              ids: torch.Tensor) -> FSBState:
    """The state after a block boundary: the newly eligible cells `ids [n]` with their summaries,
    kbar `[G, n, d]`, a `[G, n]` per (batch row, head) g, centers `[n]` (`admit_cells`)."""
    admit_cells(state.forests, kbar, a, centers, ids, state.thresholds)
    return state._replace(walks={})  # the forests have grown: their upper levels are walked again


def route_fsb_block(state: FSBState, q: torch.Tensor, pos: torch.Tensor, keys: torch.Tensor, a: torch.Tensor,
                    config: FreeSoloConfig, prior: RoutingPrior) -> torch.Tensor:
    """FS-B's cells for the queries of one block -> `[G, Q, K]` cell ids, -1 = none.

    q `[G, Q, d]` at positions `pos [Q]`, one row per (batch row, head) g; keys cell-major
    `[G, C', s, d]` (C' >= C: read in place), a `[G, C]` of the C eligible cells (any strides);
    the prior's lam, sigma `[G]`. A beam per query searches every forest of its row (`beam_search`), and
    the union of what they found is rescored by Eq. 12 (`rescore`). `config.impl` picks the search's
    implementation (`beam_search`).
    """
    return _search_and_rescore(state.forests.store, state.forests.root, state.walks, q, pos, keys, a, config, prior)


def _search_and_rescore(store: NodeStore, roots: torch.Tensor, walks: dict | None, q: torch.Tensor,
                        pos: torch.Tensor, keys: torch.Tensor, a: torch.Tensor, config: FreeSoloConfig,
                        prior: RoutingPrior) -> torch.Tensor:
    """`route_fsb_block` over forests given by their node store and roots `[G kinds]`; the prior's lam,
    sigma `[G]`."""
    kinds = store.rows // q.shape[0]
    found = beam_search(store, roots, q.repeat_interleave(kinds, dim=0), pos, config, _per_forest(prior, kinds),
                        walks=walks)  # [G kinds, Q, Wb]
    return rescore(q, keys, a, pos, _candidates(found, kinds), config, prior)


def _per_forest(prior: RoutingPrior, kinds: int) -> RoutingPrior:
    """The prior's lam, sigma `[G]` for the forest rows `[G kinds]` (one per kind of each row g)."""
    return RoutingPrior(sigma=prior.sigma.repeat_interleave(kinds), lam=prior.lam.repeat_interleave(kinds))


def _candidates(found: torch.Tensor, kinds: int) -> torch.Tensor:
    """Cells the beams found in each forest `[G kinds, Q, Wb]` -> each row's candidates `[G, Q, kinds Wb]`."""
    rows, num_q, width = found.shape
    return found.view(rows // kinds, kinds, num_q, width).transpose(1, 2).flatten(2)


# node memory the forests of one window of blocks may take (`select_cells_fsb`); a window is never made
# so small that its store is under twice what growing the forests block by block holds
STATES_BUDGET_BYTES = 1 << 30


def _blocks_per_window(kbar_rows: torch.Tensor, cells_per_block: int) -> int:
    """How many blocks' forests `select_cells_fsb` builds at once (`fsframework.ops.fsb_states`): a
    window's store holds about `2 M + (its cells) log2 M` slots per row (M cells), so the window is
    as long as `STATES_BUDGET_BYTES` allows; every window rebuilds the large chunks' trees it uses."""
    rows, most, dim = kbar_rows.shape
    node_bytes = (dim + 3) * kbar_rows.element_size() + 3 * 8  # mu and stats, links
    bits = max(most.bit_length(), 1)
    slots = max(STATES_BUDGET_BYTES // max(rows * node_bytes, 1), 4 * most)
    return max(1, (slots - 2 * most) // ((cells_per_block + 1) * bits))


def select_cells_fsb(q: torch.Tensor, k: torch.Tensor, config: FreeSoloConfig, prior: RoutingPrior, *,
                     q_start: int = 0, first_cells: torch.Tensor | None = None) -> torch.Tensor:
    """FS-B selected cells `[Bt, n, H, top_k]` (descending Eq. 12 score, -1 = none); see module docstring.

    q, k unrotated `[Bt, N, H, d]` (or q of positions `[q_start, q_start + n)` over k of
    `[0, q_start + n)`); prior.tau `[H]` (needed unless config.forests="f0"). The forests are built from
    the first block on, whatever `q_start`; only the queries of q are searched. Every batch
    row, head and forest is searched at once (one node store, one beam tensor); `config.impl` picks the
    search's implementation (`beam_search`). The forests of every block are built at once
    (`fsframework.ops.fsb_states`), the same nodes a decode cache grows block by block.

    first_cells (packed documents laid from query-block boundaries, `fsframework.ops.freesolo_documents`;
    `check_first_cells`): a block's forests hold only its own document's cells, restarting at the
    document's first cell, so every document is searched as a row of its own, in the same call.
    """
    # FS-B searches every eligible cell, as FS routes: the sizes FS checks
    check_routing_args(q, k, config.replace(variant="fs", recent_cells=0, retained_cells=0), q_start=q_start)
    cell_size, block_size, top_k, tau = config.cell_size, config.block_size, config.top_k, prior.tau
    bsz, num_q, heads, dim = q.shape
    check_fsb_args(tau, heads, beam_width=config.beam_width, top_k=top_k, bound_c=config.bound_c,
                   forests=config.forests)
    acc = torch.promote_types(q.dtype, torch.float32)
    device = q.device
    like = torch.empty((), dtype=acc, device=device)
    prior_g = RoutingPrior(*prior.per_head(heads, like=like, batch=bsz))  # [G], rows g = (b, h)
    seq = q_start + num_q
    firsts = None if first_cells is None else check_first_cells(first_cells, seq, config, q_start)
    with torch.no_grad():
        kbar, a = cell_summaries(k.detach(), cell_size)  # Bt C H d, Bt C H
        centers = (torch.arange(kbar.shape[1], device=device, dtype=acc) + 0.5) * cell_size
        # rows g = (b, h): one per batch row and head; forest rows (g, f): one per forest of each
        q_bh = q.detach().to(acc).permute(0, 2, 1, 3).reshape(bsz * heads, num_q, dim)
        # cell-major keys `[G, C, s, d]`, laid out once: the rescoring reads its cells in place (a slice
        # of a token-major buffer would be copied at every block, O(N) each)
        cells = seq // cell_size
        k_cells = (k.detach()[:, :cells * cell_size].to(acc).permute(0, 2, 1, 3)
                   .reshape(bsz * heads, cells, cell_size, dim))
        kbar_bh, a_bh = kbar.transpose(1, 2).flatten(0, 1), a.transpose(1, 2).flatten(0, 1)  # [G, C, d], [G, C]
        out = torch.full((bsz * heads, num_q, top_k), -1, dtype=torch.long, device=device)
        starts = [start for start, _ in query_blocks(block_size, block_size, seq)]  # the first has no cell
        # the first block holding queries of q (none when q is empty or there is one block)
        first = next((j for j, start in enumerate(starts) if start + block_size > q_start), None)
        if first is None:
            return out.view(bsz, heads, num_q, top_k).transpose(1, 2).contiguous()
        # the forests of a window of blocks at once: block j's hold the cells complete before it
        arrived = [start // cell_size for start in starts]
        kinds = len(FOREST_KINDS[config.forests])
        thresholds = forest_thresholds(tau, heads, bsz, FOREST_KINDS[config.forests], like=like)
        kbar_rows, a_rows, keep = _forest_rows(kbar_bh[:, :arrived[-1]], a_bh[:, :arrived[-1]], thresholds)
        window = _blocks_per_window(kbar_rows, block_size // cell_size)
        for lo in range(first - first % window, len(starts), window):
            here = arrived[lo:lo + window]
            # starts[j] is block j + 1's (the first block has no cell)
            documents = None if firsts is None else torch.tensor(firsts[lo + 1:lo + 1 + window], device=device)
            store, roots = forest_states(kbar_rows[:, :here[-1]], a_rows[:, :here[-1]], centers[:here[-1]],
                                         torch.arange(here[-1], device=device), keep[:, :here[-1]],
                                         torch.tensor(here, device=device), firsts=documents)
            # the window's blocks that search: not before the queries, nor a document's first block (no cell
            # of its own before it); their queries in one search (one kernel launch), each of its block's state
            blocks = [(block, slice(start - q_start, min(start + block_size, seq) - q_start))
                      for block, start in enumerate(starts[lo:lo + window]) if start >= q_start
                      and (firsts is None or firsts[lo + 1 + block] * cell_size != start)]
            if not blocks:
                continue
            # a group of blocks at a time: its candidates `[G kinds, queries, Wb]` within CANDIDATES_BUDGET
            group = max(1, CANDIDATES_BUDGET // (bsz * heads * kinds * block_size * config.beam_width))
            for at in range(0, len(blocks), group):
                _route_blocks(blocks[at:at + group], store, roots, q_bh, q_start, k_cells, a_bh, out, config,
                              prior_g, kinds)
    return out.view(bsz, heads, num_q, top_k).transpose(1, 2).contiguous()


# candidate cells (int64 entries) that one group of blocks of whole-sequence FS-B routing holds at once
CANDIDATES_BUDGET = 1 << 23


def _route_blocks(blocks: list[tuple[int, slice]], store: NodeStore, roots: torch.Tensor, q_bh: torch.Tensor,
                  q_start: int, k_cells: torch.Tensor, a_bh: torch.Tensor, out: torch.Tensor, config: FreeSoloConfig,
                  prior: RoutingPrior, kinds: int) -> None:
    """FS-B's cells for a group of query blocks `(state, query rows)` of one window of forest states
    (`store`, roots `[G kinds, J]`), written into `out [G, n, K]`: their queries searched together
    (`search_states`: one launch of the kernel) and rescored together (`rescore_blocks`)."""
    groups, _, dim = q_bh.shape
    block_size = config.block_size
    # the blocks' queries end to end; only the sequence's last block may be short
    rows = torch.tensor([r for _, piece in blocks for r in range(piece.start, piece.stop)], device=q_bh.device)
    segments, at = [], 0
    for block, piece in blocks:
        segments.append((block, at, at + piece.stop - piece.start))
        at += piece.stop - piece.start
    queries, pos = q_bh[:, rows], rows.to(q_bh.dtype) + q_start
    found = search_states(store, roots, queries.repeat_interleave(kinds, dim=0), pos, segments, config,
                          _per_forest(prior, kinds))
    # Eq. 12 for every block at once, each over its own union of candidates
    short = len(blocks) * block_size - at  # zero queries with no candidate after the short block
    shape = (groups, len(blocks), block_size)
    out[:, rows] = rescore_blocks(
        F.pad(queries, (0, 0, 0, short)).view(*shape, dim), k_cells, a_bh, F.pad(pos, (0, short)).view(shape[1:]),
        F.pad(_candidates(found, kinds), (0, 0, 0, short), value=-1).view(*shape, -1), config, prior
    ).flatten(1, 2)[:, :at]
