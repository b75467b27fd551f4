"""FS-B's beam search (docs/freesolo.md §1.8) as one kernel: a program walks one query's beam down
one forest from the root to the leaves, every level in registers.

Reference: `fsframework.ops.fsb_search.beam_search` (impl="reference"), which takes tens of small
tensor ops per level (gathers, a sort, a tie check, a compaction), so that a decoded FS-B token
or a prefilled query block launches hundreds of them; here a search is one launch.

Legend: G forest rows (batch row x head x forest kind), Q queries, d head width, Wb beam width
(WBP its power-of-two padding), BD the padded head width.

A program holds the beam as `Wb` node ids. Each level it loads the left and right children of
the beam's inner nodes (`links`: left, right, cell), scores each child by the bound

    U_v = (q . mu_v + c rho_v ||q||) / sqrt(d) + lam_h A_v erf((i - pmin_v) / (2 sigma_h))

and ranks it by how many children beat it: a larger `U_v`, or an equal `U_v` and a smaller
`pmin_v` (the reference's order; the subtrees a beam holds are disjoint, so their `pmin_v`
differ and ranks are distinct). Leaves keep their slots; the `Wb - |leaves|` free slots take
the children of rank `0, 1, ...` in order (`[WBP, WBP]` comparisons per side, no sort). When
every child fits, all are kept, as the reference's shortcut does. The beam's final leaves are
the cells found: the same set as the reference's, possibly in other slots (slots are storage;
the rescoring sorts the candidates). A program reads its query's root from `roots [G, J]` at the
state `states[i]` it searches: whole-sequence routing searches the blocks of a window, each in its
own state of the forests, in one launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fsf_kernels.common.targets import launch
from fsf_kernels.common.utils import next_pow2


@triton.jit
def _bounds(mu, stats, nodes, valid, qv, c_qn, offs_d, dmask, pos_i, lam_g, two_sigma, sqrt_d, s_mu_n):
    """`U_v` and `pmin_v` of `nodes [WBP]` (`-inf` where not `valid`); `mu`, `stats` point at the row."""
    rows = tl.load(mu + nodes[:, None] * s_mu_n + offs_d[None, :], mask=valid[:, None] & dmask[None, :], other=0.0)
    dots = tl.sum(rows * qv[None, :], axis=1)
    rho = tl.load(stats + nodes * 3, mask=valid, other=0.0)
    amax = tl.load(stats + nodes * 3 + 1, mask=valid, other=0.0)
    pmin = tl.load(stats + nodes * 3 + 2, mask=valid, other=0.0)
    gate = tl.math.erf((pos_i - pmin) / two_sigma)
    bound = (dots + rho * c_qn) / sqrt_d + lam_g * amax * gate  # c_qn = c ||q||, as the reference groups it
    return tl.where(valid, bound, float("-inf")), pmin


@triton.jit
def _beaten_by(u_x, p_x, u_y, p_y, valid_y):
    """For each x: how many valid y rank before it (larger U, or equal U and smaller pmin)."""
    before = (u_y[None, :] > u_x[:, None]) | ((u_y[None, :] == u_x[:, None]) & (p_y[None, :] < p_x[:, None]))
    return tl.sum((before & valid_y[None, :]).to(tl.int32), axis=1)


@triton.jit
def _placed(free_slot, open_slot, rank, keep, nodes):
    """For each slot: the kept node whose rank is the slot's place among the free slots, else -1."""
    match = open_slot[:, None] & keep[None, :] & (rank[None, :] == free_slot[:, None])
    return tl.sum(tl.where(match, nodes[None, :] + 1, 0), axis=1) - 1


@triton.jit
def fsb_beam_kernel(mu, stats, links, roots, states, q, pos, lam, sigma, out, dim, bound_c, sqrt_d,
                    s_mu_g, s_mu_n, s_st_g, s_ln_g, s_r_g, s_q_g, s_q_q, s_o_g, s_o_q,
                    WB: tl.constexpr, WBP: tl.constexpr, BD: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1).to(tl.int64)
    mu += g * s_mu_g
    stats += g * s_st_g
    links += g * s_ln_g
    offs_d = tl.arange(0, BD)
    dmask = offs_d < dim
    qv = tl.load(q + g * s_q_g + i * s_q_q + offs_d, mask=dmask, other=0.0)
    c_qn = bound_c * tl.sqrt(tl.sum(qv * qv, axis=0))
    pos_i = tl.load(pos + i)
    lam_g = tl.load(lam + g)
    two_sigma = 2.0 * tl.load(sigma + g)
    slots = tl.arange(0, WBP)
    real = slots < WB
    root = tl.load(roots + g * s_r_g + tl.load(states + i))  # the root of the forests' state query i reads
    beam = tl.where(slots == 0, root, -1).to(tl.int64)
    held = beam >= 0
    cell = tl.load(links + beam * 3 + 2, mask=held, other=-1)
    leaf = held & (cell >= 0)
    inner = held & (cell < 0)
    while tl.sum(inner.to(tl.int32), axis=0) > 0:
        left = tl.load(links + beam * 3, mask=inner, other=-1)
        right = tl.load(links + beam * 3 + 1, mask=inner, other=-1)
        ok_l, ok_r = left >= 0, right >= 0
        u_l, p_l = _bounds(mu, stats, left, ok_l, qv, c_qn, offs_d, dmask, pos_i, lam_g, two_sigma, sqrt_d, s_mu_n)
        u_r, p_r = _bounds(mu, stats, right, ok_r, qv, c_qn, offs_d, dmask, pos_i, lam_g, two_sigma, sqrt_d, s_mu_n)
        rank_l = _beaten_by(u_l, p_l, u_l, p_l, ok_l) + _beaten_by(u_l, p_l, u_r, p_r, ok_r)
        rank_r = _beaten_by(u_r, p_r, u_l, p_l, ok_l) + _beaten_by(u_r, p_r, u_r, p_r, ok_r)
        free = WB - tl.sum(leaf.to(tl.int32), axis=0)
        open_slot = real & ~leaf
        free_slot = tl.cumsum(open_slot.to(tl.int32), axis=0) - 1
        taken = tl.maximum(_placed(free_slot, open_slot, rank_l, ok_l & (rank_l < free), left),
                           _placed(free_slot, open_slot, rank_r, ok_r & (rank_r < free), right))
        beam = tl.where(leaf, beam, taken)
        held = beam >= 0
        cell = tl.load(links + beam * 3 + 2, mask=held, other=-1)
        leaf = held & (cell >= 0)
        inner = held & (cell < 0)
    tl.store(out + g * s_o_g + i * s_o_q + slots, tl.where(leaf, cell, -1), mask=real)


def beam_widths(beam_width: int) -> tuple[int, int]:
    """(WB, WBP): the beam width and its power-of-two padding (the kernel's vector extent)."""
    return beam_width, next_pow2(max(beam_width, 2))


def beam_search(mu: torch.Tensor, stats: torch.Tensor, links: torch.Tensor, roots: torch.Tensor, q: torch.Tensor,
                pos: torch.Tensor, *, beam_width: int, lam: torch.Tensor, sigma: torch.Tensor,
                bound_c: float, states: torch.Tensor | None = None) -> torch.Tensor:
    """Cells each query's beam reaches in its row's forest -> `[G, Q, Wb]` long, -1 = none.

    mu `[G, cap, d]`, stats `[G, cap, 3]` (rho, amax, pmin), links `[G, cap, 3]` long (left, right,
    cell; -1 = none) (`fsframework.ops.fsb_forest.NodeStore.buffers`), roots `[G]` (-1: empty),
    q `[G, Q, d]` at positions `pos [Q]`, lam, sigma `[G]`; q, mu, stats, pos, lam, sigma of one
    float dtype. With `states [Q]` (long) the store holds several states of each row's forests
    (`fsframework.ops.fsb_states`): roots `[G, J]`, and query i searches the state `states[i]`, so the
    queries of many query blocks take one launch. The cells are the reference's set per (row, query),
    in slots of the kernel's own.
    """
    groups, num_q, dim = q.shape
    if states is None:
        roots, states = roots[:, None], torch.zeros(num_q, dtype=torch.long, device=q.device)
    if roots.dim() != 2 or roots.shape[0] != groups or tuple(states.shape) != (num_q,):
        raise ValueError(f"roots must be [G] or [G, J] with states [Q] (G={groups}, Q={num_q}), got roots "
                         f"{tuple(roots.shape)} and states {tuple(states.shape)}")
    mu, stats, links, roots, states, q, pos, lam, sigma = (
        t.contiguous() for t in (mu, stats, links, roots, states, q, pos, lam, sigma))
    out = torch.empty(groups, num_q, beam_width, dtype=torch.long, device=q.device)
    if groups == 0 or num_q == 0:
        return out
    wb, wbp = beam_widths(beam_width)
    fsb_beam_kernel[(num_q, groups)](
        mu, stats, links, roots, states, q, pos, lam, sigma, out, dim, float(bound_c), float(dim) ** 0.5,
        mu.stride(0), mu.stride(1), stats.stride(0), links.stride(0), roots.stride(0), q.stride(0), q.stride(1),
        out.stride(0), out.stride(1), WB=wb, WBP=wbp, BD=next_pow2(dim))
    return out


def launches(dtype: torch.dtype, dim: int, beam_width: int, arch: int) -> list:
    """The launch `beam_search` makes for this dtype, head dim and beam width (one per call; `arch`
    changes nothing: the kernel holds no tile in shared memory), for `fsf_kernels.compile_check`."""
    p = {torch.float32: "*fp32", torch.float64: "*fp64"}[dtype]
    wb, wbp = beam_widths(beam_width)
    pointers = dict(mu=p, stats=p, links="*i64", roots="*i64", states="*i64", q=p, pos=p, lam=p, sigma=p, out="*i64")
    return [launch("fsb beam search", fsb_beam_kernel, pointers, dict(WB=wb, WBP=wbp, BD=next_pow2(dim)),
                   floats={"bound_c", "sqrt_d"})]
