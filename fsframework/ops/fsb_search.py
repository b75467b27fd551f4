"""FS-B routing (docs/freesolo.md §1.8): beam search over two forests, then Eq. 12 rescoring.

Reference implementation in plain PyTorch; inference only (no gradient, no kernel).
Legend: Bt batch, N tokens, H heads, d head width, Q queries of one block, Wb beam
width, K top_k, s cell size.

Per batch row and head, two forests (`fsframework.ops.fsb_forest.Forest`) grow at
every query-block boundary with the newly eligible cells: `F0` admits every cell,
`Ftau` the cells with `a_c >= tau_h`. For the queries of a block, a beam starts at
each root; at each level the beam keeps its leaves (never evicted) and fills the
other `Wb - |leaves|` slots with the children of its inner nodes of largest

    U_v = (q . mu_v + c * rho_v * ||q||) / sqrt(d) + lam_h * A_v * erf((i - pmin_v) / (2 sigma_h))

(ties: smaller `pmin_v`), until only leaves remain. `U_v` bounds Eq. 7's score of
every cell below `v` when `c >= 1`. The union of both beams' cells is rescored by

    R_ic = logsumexp_{j in cell c}(q_i . k_j / sqrt(d)) + lam_h * a_c * erf((i - p_c) / (2 sigma_h))

and the top-K (ties: earlier cell) are read (§1.6). Search costs `O(Wb log M d)` per
query, rescoring `O(Wb s d)`. With `Wb` at least the number of admitted cells the
beam never drops a node, so the result is the exact top-K of Eq. 12.
"""

from __future__ import annotations

import math

import torch

from fsf_kernels.common.args import check_routing_args, per_head
from fsframework.ops.freesolo_routing import cell_summaries, top_k_earliest
from fsframework.ops.fsb_forest import Forest

FORESTS = ("both", "f0", "ftau")


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


def node_bounds(forest: Forest, q: torch.Tensor, qnorm: torch.Tensor, pos: torch.Tensor, nodes: torch.Tensor,
                *, lam: torch.Tensor, sigma: torch.Tensor, bound_c: float) -> torch.Tensor:
    """`U_v` for node ids `nodes [Q, m]` (entries < 0 give garbage: mask them) of queries q `[Q, d]`."""
    idx = nodes.clamp_min(0)
    scale = 1.0 / math.sqrt(q.shape[-1])
    content = torch.einsum("qd,qmd->qm", q, forest.mu[idx]) + bound_c * forest.rho[idx] * qnorm[:, None]
    gate = torch.erf((pos[:, None] - forest.pmin[idx]) / (2.0 * sigma))
    return content * scale + lam * forest.amax[idx] * gate


def beam_search(forest: Forest, q: torch.Tensor, pos: torch.Tensor, *, beam_width: int, lam: torch.Tensor,
                sigma: torch.Tensor, bound_c: float) -> torch.Tensor:
    """Leaves reached by the beam of each query: cells `[Q, Wb]`, -1 = none (Eq. 11)."""
    num_q = q.shape[0]
    beam = torch.full((num_q, beam_width), -1, dtype=torch.long, device=q.device)
    if forest.root < 0:
        return beam
    beam[:, 0] = forest.root
    qnorm = torch.linalg.vector_norm(q, dim=-1)
    while True:
        valid = beam >= 0
        idx = beam.clamp_min(0)
        leaf = valid & (forest.cell[idx] >= 0)
        inner = valid & ~leaf
        if not bool(inner.any()):
            return torch.where(leaf, forest.cell[idx], -1)
        children = torch.stack((forest.left[idx], forest.right[idx]), dim=-1).flatten(-2)  # Q 2Wb
        children = torch.where(inner.repeat_interleave(2, dim=-1), children, -1)
        cand = torch.cat((torch.where(leaf, beam, -1), children), dim=-1)  # Q 3Wb
        key = torch.cat((torch.full_like(beam, 0, dtype=q.dtype).masked_fill(leaf, float("inf")),
                         node_bounds(forest, q, qnorm, pos, children, lam=lam, sigma=sigma, bound_c=bound_c)), -1)
        key = key.masked_fill(cand < 0, float("-inf"))
        # rank by key, ties by smaller pmin: sort by pmin first, then a stable sort by key
        by_pmin = forest.pmin[cand.clamp_min(0)].sort(dim=-1, stable=True).indices
        key, cand = key.gather(-1, by_pmin), cand.gather(-1, by_pmin)
        order = key.sort(dim=-1, descending=True, stable=True).indices[:, :beam_width]
        beam = torch.where(key.gather(-1, order) > float("-inf"), cand.gather(-1, order), -1)


def rescore(q: torch.Tensor, keys: torch.Tensor, a: torch.Tensor, centers: torch.Tensor, pos: torch.Tensor,
            cand: torch.Tensor, *, cell_size: int, top_k: int, lam: torch.Tensor, sigma: torch.Tensor,
            chunk: int = 32) -> torch.Tensor:
    """Top-K cells of Eq. 12 among candidates `cand [Q, m]` (-1 pads, duplicates allowed) -> `[Q, K]`.

    keys `[N, d]` unrotated token keys of one head; a, centers `[C]`. Ties go to the earlier cell.
    """
    num_cells = a.shape[0]
    # ascending cell order with pads last, duplicates dropped: position order is cell order
    cand = torch.where(cand >= 0, cand, num_cells).sort(dim=-1).values
    valid = cand < num_cells
    valid[:, 1:] &= cand[:, 1:] != cand[:, :-1]
    idx = cand.clamp_max(num_cells - 1) if num_cells else cand.clamp_max(0)
    scale = 1.0 / math.sqrt(q.shape[-1])
    cells_keys = keys[: num_cells * cell_size].view(num_cells, cell_size, -1)
    scores = torch.empty(cand.shape, dtype=q.dtype, device=q.device)
    for lo in range(0, q.shape[0], chunk):  # [chunk, m, s, d] gathered keys at a time
        hi = min(lo + chunk, q.shape[0])
        logits = torch.einsum("qd,qmsd->qms", q[lo:hi], cells_keys[idx[lo:hi]]) * scale
        scores[lo:hi] = logits.logsumexp(dim=-1)
    scores = scores + lam * a[idx] * torch.erf((pos[:, None] - centers[idx]) / (2.0 * sigma))
    choice = top_k_earliest(scores, valid, top_k)
    return torch.where(choice >= 0, cand.gather(-1, choice.clamp_min(0)), -1)


def select_cells_fsb(q: torch.Tensor, k: torch.Tensor, *, tau: torch.Tensor | None = None, beam_width: int = 16,
                     bound_c: float = 8.0, forests: str = "both", cell_size: int = 32, block_size: int = 128,
                     top_k: int = 4, sigma: float | torch.Tensor = 4.0, lam: float | torch.Tensor = 1.0,
                     q_start: int = 0) -> torch.Tensor:
    """FS-B selected cells `[Bt, n, H, top_k]` (descending Eq. 12 score, -1 = none); see module docstring.

    q, k unrotated `[Bt, N, H, d]` (or q of positions `[q_start, q_start + n)` over k of
    `[0, q_start + n)`); tau `[H]` (needed unless forests="f0"). The forests are built from
    the first block on, whatever `q_start`; only the queries of q are searched.
    """
    check_routing_args(q, k, variant="fs", cell_size=cell_size, block_size=block_size, top_k=top_k,
                       recent_cells=0, retained_cells=0, q_start=q_start)
    bsz, num_q, heads, dim = q.shape
    check_fsb_args(tau, heads, beam_width=beam_width, top_k=top_k, bound_c=bound_c, forests=forests)
    acc = torch.promote_types(q.dtype, torch.float32)
    like = torch.empty((), dtype=acc, device=q.device)
    sigma_h = per_head(sigma, heads, "sigma", positive=True, like=like)
    lam_h = per_head(lam, heads, "lam", positive=False, like=like)
    tau_h = tau.detach().to(device=q.device, dtype=acc) if tau is not None else None
    seq = q_start + num_q
    out = torch.full((bsz, num_q, heads, top_k), -1, dtype=torch.long, device=q.device)
    with torch.no_grad():
        kbar, a = cell_summaries(k.detach(), cell_size)  # Bt C H d, Bt C H
        centers = (torch.arange(kbar.shape[1], device=q.device, dtype=acc) + 0.5) * cell_size
        qa, ka = q.detach().to(acc), k.detach().to(acc)
        for b in range(bsz):
            for h in range(heads):
                out[b, :, h] = _route_head(qa[b, :, h], ka[b, :, h], kbar[b, :, h], a[b, :, h], centers,
                                           None if tau_h is None else tau_h[h], seq=seq, q_start=q_start,
                                           cell_size=cell_size, block_size=block_size, top_k=top_k,
                                           beam_width=beam_width, bound_c=bound_c, forests=forests,
                                           lam=lam_h[h], sigma=sigma_h[h])
    return out


def _route_head(q, keys, kbar, a, centers, tau, *, seq, q_start, cell_size, block_size, top_k, beam_width,
                bound_c, forests, lam, sigma) -> torch.Tensor:
    """One batch row and head: q `[n, d]`, keys `[N, d]`, kbar `[C, d]`, a `[C]` -> `[n, K]`."""
    out = torch.full((q.shape[0], top_k), -1, dtype=torch.long, device=q.device)
    trees = []
    if forests in ("both", "f0"):
        trees.append((Forest(kbar, a, centers), None))
    if forests in ("both", "ftau"):
        trees.append((Forest(kbar, a, centers), tau))
    seen = 0
    for start in range(block_size, seq, block_size):  # the first block has no eligible cell
        num = start // cell_size
        new = torch.arange(seen, num, device=q.device)
        for forest, threshold in trees:  # every block boundary admits the newly eligible cells
            forest.admit(new if threshold is None else new[a[seen:num] >= threshold])
        seen = num
        if start + block_size <= q_start:
            continue
        end = min(start + block_size, seq)
        pos = torch.arange(start, end, device=q.device, dtype=q.dtype)
        qb = q[start - q_start:end - q_start]
        found = [beam_search(forest, qb, pos, beam_width=beam_width, lam=lam, sigma=sigma, bound_c=bound_c)
                 for forest, _ in trees]
        out[start - q_start:end - q_start] = rescore(qb, keys, a, centers, pos, torch.cat(found, dim=-1),
                                                     cell_size=cell_size, top_k=top_k, lam=lam, sigma=sigma)
    return out
