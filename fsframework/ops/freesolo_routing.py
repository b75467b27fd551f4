"""FreeSolo routing (docs/freesolo.md §1.3-§1.6): cell summaries, available sets and top-K selection.

Reference implementation in plain PyTorch. Legend: Bt batch, N tokens, H heads,
d head width, C complete cells, M candidate cells of one query block, K top_k.

Queries are processed one query block (`block_size` tokens) at a time: every
query of a block sees the same full prefix `C_i = {c : (c+1)s <= b_i}`, so a
block needs scores of shape `[Bt, block, H, |A_i|]` only. FS scores all of
`C_i` (`O(N^2/s)` work, `O(N)` memory); FS-L keeps each head's top-P cells by
key-norm priority incrementally, merging the `B/s` newly eligible cells of each
block into the previous top-P, so its routing is `O(N)` in time and memory.
No `N x N` or `N x N/s` tensor is ever built.

The per-block steps are ops of their own, which a decode cache calls as well
(`fsframework.ops.freesolo_decode`): `block_candidates` prepares what Eq. 7 reads of one block's
available cells and its `route` scores the block's queries over them (`route_candidates` does
both), and `admit_fsl` takes FS-L's candidate set (an `FSLState`) at a block
boundary and returns the next one.

[choice]s implemented here (docs/freesolo.md §1.5, §1.6): ties in the FS-L priority `a_c`
and ties in the routing score `r_ic` are both won by the earlier cell.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fsf_kernels.common.args import (VARIANTS, check_first_cells, check_query_offset, check_routing_args,
                                    check_summaries, prior_per_head)
from fsframework.ops.freesolo_config import FreeSoloConfig, RoutingPrior

__all__ = ["BlockCandidates", "FSLState", "VARIANTS", "admit_fsl", "block_candidates", "cell_keys_by_head",
           "cell_summaries", "check_query_offset", "check_routing_args", "prior_per_head", "query_blocks",
           "route_candidates", "select_cells_from_summaries_reference", "select_cells_reference",
           "summaries_by_head", "token_score", "top_k_earliest"]


def cell_summaries(k: torch.Tensor, cell_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Summaries of the complete cells from unrotated keys `k` `[Bt, N, H, d]`.

    Returns `kbar` `[Bt, C, H, d]` (mean key) and `a` `[Bt, C, H]` (largest key L2
    norm of the cell), `C = N // cell_size`: an incomplete trailing cell is never
    eligible, so it gets no summary. Computed in fp32 (fp64 inputs stay fp64).
    """
    bsz, seq, heads, dim = k.shape
    num_cells = seq // cell_size
    acc = torch.promote_types(k.dtype, torch.float32)
    kc = k[:, : num_cells * cell_size].to(acc).view(bsz, num_cells, cell_size, heads, dim)
    return kc.mean(dim=2), torch.linalg.vector_norm(kc, dim=-1).amax(dim=2)


# at most this many scores, a stable sort is the cheaper exact top-K (one op instead of ~20: a
# decoded token's few candidates); above it `topk` plus the tie pass wins (measured on CPU)
_SORT_MAX_SCORES = 4096


def top_k_earliest(scores: torch.Tensor, valid: torch.Tensor | None, top_k: int) -> torch.Tensor:
    """Positions of the `top_k` largest `scores` along the last axis, best first.

    scores `[..., M]`, ordered so that position order is cell order among the
    valid entries; valid: bool, broadcastable to scores, or None (all valid).
    Returns `[..., top_k]` long positions, -1 where fewer than `top_k` are valid.
    Ties are won by the lower position, exactly: a small call sorts stably; a
    large one takes only the K-th value from `torch.topk`, everything above it,
    and equal values in position order (cumulative count) until K are chosen.
    """
    lead, num = scores.shape[:-1], scores.shape[-1]
    kt = min(top_k, num)
    if kt > 0 and scores.numel() <= _SORT_MAX_SCORES:
        taken = _top_k_by_sort(scores, valid, kt)
        return taken if kt == top_k else F.pad(taken, (0, top_k - kt), value=-1)
    out = torch.full((*lead, top_k), -1, dtype=torch.long, device=scores.device)
    if kt == 0:
        return out
    if valid is not None:
        scores = scores.masked_fill(~valid, float("-inf"))
    kth = scores.topk(kt, dim=-1, sorted=True).values[..., -1:]
    above = scores > kth
    tied = scores == kth
    if valid is not None:
        tied &= valid  # a -inf K-th value means fewer than K valid cells: take only the valid ones
    need = kt - above.sum(dim=-1, keepdim=True)
    take = above | (tied & (tied.cumsum(dim=-1) <= need))
    # compact the taken positions into kt slots (in position order); slot kt is a dump
    slot = torch.where(take, take.cumsum(dim=-1) - 1, kt)
    pos = torch.arange(num, device=scores.device).expand_as(scores)
    picked = torch.full((*lead, kt + 1), -1, dtype=torch.long, device=scores.device)
    picked.scatter_(-1, slot, pos)
    picked_scores = torch.full((*lead, kt + 1), float("-inf"), dtype=scores.dtype, device=scores.device)
    picked_scores.scatter_(-1, slot, scores)
    # a stable descending sort of slots already in position order keeps earlier cells first on ties
    order = picked_scores[..., :kt].sort(dim=-1, descending=True, stable=True).indices
    out[..., :kt] = picked[..., :kt].gather(-1, order)
    return out


def _top_k_by_sort(scores: torch.Tensor, valid: torch.Tensor | None, kt: int) -> torch.Tensor:
    """`top_k_earliest`'s first `kt` slots by one stable sort: ascending on the negated scores, so equal
    scores keep position order and invalid entries, set to NaN (which an ascending sort puts last),
    come after every valid one, even a valid -inf."""
    keys = scores.neg() if valid is None else torch.where(valid, scores.neg(), float("nan"))
    taken = keys.sort(dim=-1, stable=True).indices[..., :kt]
    return taken if valid is None else torch.where(valid.expand_as(scores).gather(-1, taken), taken, -1)


def select_cells_reference(q: torch.Tensor, k: torch.Tensor, config: FreeSoloConfig, prior: RoutingPrior, *,
                           q_start: int = 0, first_cells: torch.Tensor | None = None) -> torch.Tensor:
    """Selected cells `[Bt, N, H, top_k]` (descending score, -1 = none) for unrotated q, k `[Bt, N, H, d]`.

    With `q_start` > 0, q holds only the queries of positions `[q_start, q_start + n)`
    and k the keys of `[0, q_start + n)`; the result is then `[Bt, n, H, top_k]`.
    `first_cells` (documents laid at block boundaries, `check_first_cells`): the first cell each
    query block may read. See `fsframework.ops.freesolo.select_cells` for the full contract.
    """
    check_routing_args(q, k, config, q_start=q_start)
    kbar, a = summaries_by_head(k, config.cell_size)
    keys = cell_keys_by_head(k, config.cell_size, kbar.dtype) if config.route_score == "tokens" else None
    return select_cells_from_summaries_reference(q, kbar, a, config, prior, q_start=q_start, first_cells=first_cells,
                                                 keys=keys)


def cell_keys_by_head(k: torch.Tensor, cell_size: int, dtype: torch.dtype) -> torch.Tensor:
    """The complete cells' token keys head-major `[Bt, H, C, s, d]` in `dtype` (no gradient), for
    `route_score="tokens"`."""
    bsz, seq, heads, dim = k.shape
    num_cells = seq // cell_size
    cells = k.detach()[:, : num_cells * cell_size].to(dtype).view(bsz, num_cells, cell_size, heads, dim)
    return cells.permute(0, 3, 1, 2, 4)


def summaries_by_head(k: torch.Tensor, cell_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`cell_summaries` head-major, as routing reads them: kbar `[Bt, H, C, d]`, a `[Bt, H, C]`; no gradient."""
    with torch.no_grad():
        kbar, a = cell_summaries(k.detach(), cell_size)
    return kbar.transpose(1, 2), a.transpose(1, 2).contiguous()


def select_cells_from_summaries_reference(q: torch.Tensor, kbar: torch.Tensor, a: torch.Tensor, config: FreeSoloConfig,
                                          prior: RoutingPrior, *, q_start: int = 0,
                                          first_cells: torch.Tensor | None = None,
                                          keys: torch.Tensor | None = None) -> torch.Tensor:
    """`select_cells_reference` from the keys' summaries (`summaries_by_head`): q `[Bt, n, H, d]` at
    positions `[q_start, q_start + n)`, kbar `[Bt, H, C, d]` and a `[Bt, H, C]` of the complete cells of
    `[0, q_start + n)` -> `[Bt, n, H, top_k]`. The summaries' dtype is the score dtype. `first_cells`:
    `check_first_cells`. `config.route_score="tokens"` also reads the cells' token keys `keys`
    `[Bt, H, C, s, d]` (`cell_keys_by_head`); the summaries alone do not say it."""
    if (config.route_score == "tokens") != (keys is not None):
        raise ValueError(f"model.attention.route_score={config.route_score!r} routes "
                         + ("from the cells' token keys: pass keys" if keys is None else "from the summaries alone"))
    bsz, seq, heads, dim = q.shape
    cell_size = config.cell_size
    check_summaries(q, kbar, a, cell_size=cell_size, q_start=q_start)
    firsts = None if first_cells is None else check_first_cells(first_cells, seq, config, q_start)
    num_cells = (q_start + seq) // cell_size
    acc = torch.promote_types(q.dtype, torch.float32)
    like = torch.empty((), dtype=acc, device=q.device)
    prior_h = RoutingPrior(*prior.per_head(heads, like=like))
    out = torch.full((bsz, seq, heads, config.top_k), -1, dtype=torch.long, device=q.device)
    with torch.no_grad():  # hard selections receive no gradient (docs/freesolo.md §1.6)
        centers = (torch.arange(num_cells, device=q.device, dtype=acc) + 0.5) * cell_size
        route = _route_fs if config.variant == "fs" else _route_fsl
        route(q, kbar, a, centers, out, config, prior_h, q_start, firsts, keys)
    return out


@dataclass(frozen=True)
class BlockCandidates:
    """What Eq. 7 reads of one query block's candidate cells (docs/freesolo.md §1.4), prepared once per
    block: whole-sequence routing builds one per block, a decode cache keeps its block's for every token
    of it. Shapes broadcast against the scores `[Bt, n, H, M]`; the summaries' dtype is the score dtype."""

    kbar: torch.Tensor  # [Bt, H, M, d] mean keys
    amplitude: torch.Tensor  # [Bt, 1, H, M] lam_h * a_c
    centers: torch.Tensor  # [Bt, 1, H, M] p_c = (c + 1/2) s
    width: torch.Tensor  # [H, 1] 2 sigma_h
    valid: torch.Tensor | None  # [Bt, 1, H, M] bool, or None (all valid)
    # [Bt, H, M, s, d] the candidates' token keys: the content term is then the log-sum-exp of the
    # cell's token logits (`route_score="tokens"`, docs/freesolo.md "Departures"); None: q . kbar (Eq. 7)
    keys: torch.Tensor | None = None

    def route(self, q: torch.Tensor, q_start: int, top_k: int) -> torch.Tensor:
        """Eq. 7 and top-K for queries q `[Bt, n, H, d]` (unrotated) at positions `[q_start, q_start + n)`,
        inside the block -> `[Bt, n, H, K]` positions into M, best first, -1 where fewer are valid."""
        num, dim = q.shape[1], q.shape[3]
        with torch.no_grad():  # hard selections receive no gradient (docs/freesolo.md §1.6)
            q = q.detach().to(self.kbar.dtype)
            if self.keys is None:
                content = torch.einsum("bqhd,bhmd->bqhm", q, self.kbar) * (1.0 / math.sqrt(dim))
            else:
                content = token_score(q, self.keys)
            pos = torch.arange(q_start, q_start + num, device=q.device).to(self.amplitude.dtype)
            prior = self.amplitude * torch.erf((pos[None, :, None, None] - self.centers) / self.width)
            return top_k_earliest(content + prior, self.valid, top_k)


def token_score(q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The content term of `route_score="tokens"`: per query and candidate cell, the log-sum-exp of the
    cell's token logits, `log sum_{j in c} exp(q_i . k_j / sqrt(d))` (Eq. 12's content term, FS-B's
    rescoring, docs/freesolo.md §1.8). q `[Bt, n, H, d]`, keys `[Bt, H, M, s, d]` -> `[Bt, n, H, M]` in
    keys' dtype."""
    logits = torch.einsum("bqhd,bhmsd->bqhms", q.to(keys.dtype), keys) * (1.0 / math.sqrt(q.shape[-1]))
    return logits.logsumexp(dim=-1)


def block_candidates(kbar: torch.Tensor, a: torch.Tensor, centers: torch.Tensor, valid: torch.Tensor | None,
                     prior: RoutingPrior, keys: torch.Tensor | None = None) -> BlockCandidates:
    """A block's `BlockCandidates` from its candidates' summaries: kbar `[Bt, H, M, d]`, a `[Bt, H, M]`,
    centers `(c + 1/2) s` broadcastable to `[Bt, H, M]`, valid bool `[Bt, H, M]` or None; the prior's
    sigma (> 0) and lam (>= 0) floats or `[H]` tensors. Candidates are listed in cell order among the
    valid ones, so ties go to the earlier cell. keys `[Bt, H, M, s, d]` (route_score="tokens"): the
    candidates' token keys, scored by `token_score` instead of `q . kbar`."""
    like = torch.empty((), dtype=kbar.dtype, device=kbar.device)
    sigma_h, lam_h = prior.per_head(kbar.shape[1], like=like)
    return BlockCandidates(kbar=kbar, amplitude=(lam_h[:, None] * a)[:, None],
                           centers=centers.expand_as(a)[:, None], width=(2.0 * sigma_h)[:, None],
                           valid=None if valid is None else valid[:, None],
                           keys=None if keys is None else keys.to(kbar.dtype))


def route_candidates(q: torch.Tensor, q_start: int, kbar: torch.Tensor, a: torch.Tensor, centers: torch.Tensor,
                     valid: torch.Tensor | None, prior: RoutingPrior, top_k: int,
                     keys: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 7 and top-K for the queries of one query block over its available cells -> `[Bt, n, H, K]`
    positions into M, best first, -1 where fewer are valid: `block_candidates(...).route(q, q_start, top_k)`.

    q: unrotated `[Bt, n, H, d]` at positions `[q_start, q_start + n)` (inside one block); kbar
    `[Bt, H, M, d]`, a `[Bt, H, M]` (the summaries' dtype is the score dtype); centers `(c + 1/2) s`,
    broadcastable to `[Bt, H, M]`; valid: bool `[Bt, H, M]` or None. Candidates are listed in cell
    order among the valid ones, so ties go to the earlier cell. keys `[Bt, H, M, s, d]`: score the content
    by the candidates' token keys (`route_score="tokens"`, `token_score`).
    """
    return block_candidates(kbar, a, centers, valid, prior, keys).route(q, q_start, top_k)


@dataclass(frozen=True)
class FSLState:
    """FS-L's candidate cells of one query block (docs/freesolo.md §1.5), per batch row and head: the
    retained cells (the first `num_kept`, ascending) then the recent ones (ascending). Every tensor is
    `[Bt, H, M, ...]`, one entry per candidate; `keys`/`values` are carried by a decode cache (its
    readout reads the candidates' raw keys), and `keys` by whole-sequence routing with
    `route_score="tokens"` (it scores them); None otherwise."""

    cells: torch.Tensor  # [Bt, H, M] cell ids
    a: torch.Tensor  # [Bt, H, M] priority: the cell's largest key norm
    kbar: torch.Tensor  # [Bt, H, M, d] mean key
    keys: torch.Tensor | None = None  # [Bt, H, M, s, d] raw keys
    values: torch.Tensor | None = None  # [Bt, H, M, s, d] raw values
    num_kept: int = 0  # how many of the M are retained cells (the rest are recent ones)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensor fields it carries, by name."""
        return {name: x for name in _FSL_TENSORS if (x := getattr(self, name)) is not None}

    def valid(self, num_cells: int, recent: int) -> torch.Tensor:
        """Which candidates are scored once `num_cells` cells are eligible `[Bt, H, M]`: retained cells
        inside the recent window are listed twice, only their recent copy counts, so the valid ones stay
        in cell order."""
        valid = torch.ones_like(self.cells, dtype=torch.bool)
        valid[:, :, :self.num_kept] = self.cells[:, :, :self.num_kept] < max(0, num_cells - recent)
        return valid


_FSL_TENSORS = ("cells", "a", "kbar", "keys", "values")


def admit_fsl(state: FSLState | None, new: FSLState, *, retained: int, recent: int) -> FSLState:
    """FS-L's candidate cells after a block boundary (docs/freesolo.md §1.5): the state in, the next one out.

    `state` is None before the first boundary. `new` holds the newly eligible cells (its `num_kept` is
    not read), ascending and after every cell of the state, with the same fields. The next retained set
    is the top-`retained` by `a` of the kept and new cells (a stable sort of a cell-ordered list: ties
    go to the earlier cell); the next recent set the last `recent` of the recent and new cells.
    """
    fresh = new.tensors()
    if state is None:
        pool, both = fresh, fresh
    else:
        old, kept = state.tensors(), state.num_kept
        pool = {name: torch.cat((old[name][:, :, :kept], x), dim=2) for name, x in fresh.items()}
        both = {name: torch.cat((old[name][:, :, kept:], x), dim=2) for name, x in fresh.items()}
    if pool["cells"].shape[2] > retained:
        best = pool["a"].sort(dim=-1, descending=True, stable=True).indices[..., :retained]
        best = best.sort(dim=-1).values  # back to cell order (pool positions are in cell order)
        pool = {name: _take(x, best) for name, x in pool.items()}
    merged = {name: torch.cat((pool[name], x[:, :, max(0, x.shape[2] - recent):]), dim=2).contiguous()
              for name, x in both.items()}
    return FSLState(**merged, num_kept=pool["cells"].shape[2])


def _take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Entries `index` `[B, H, M']` along dim 2 of `x` `[B, H, M, ...]`."""
    return x.gather(2, index.view(*index.shape, *([1] * (x.dim() - 3))).expand(*index.shape, *x.shape[3:]))


def query_blocks(block_size: int, begin: int, end: int) -> Iterator[tuple[int, int]]:
    """The pieces of positions `[begin, end)` that lie in one query block each, in order: `(lo, hi)`, the
    block's positions clipped to `[begin, end)`. The queries of a block share their available cells
    (docs/freesolo.md §1.3), so routing, FS-B's search and the decode caches all walk blocks with it."""
    for first in range(begin - begin % block_size, end, block_size):
        yield max(first, begin), min(first + block_size, end)


def _route_fs(q, kbar_h, a_h, centers, out, config: FreeSoloConfig, prior: RoutingPrior, q_start: int,
              firsts: list[int] | None = None, keys: torch.Tensor | None = None):
    """FS: `A_i = C_i`; one `[Bt, block, H, |C_i|]` score tile per query block (with `firsts`, only the
    block's own document's cells, `[first, b / s)`)."""
    cell_size, block_size = config.cell_size, config.block_size
    seq = q_start + q.shape[1]
    for start, end in query_blocks(block_size, max(block_size, q_start), seq):  # the first block has no cell
        num = start // cell_size  # cells with (c+1)s <= start; all of them are complete
        lo = 0 if firsts is None else firsts[start // block_size]
        if lo >= num:  # a document's first block: no cell of its own before it
            continue
        rows = slice(start - q_start, end - q_start)
        choice = route_candidates(q[:, rows], start, kbar_h[:, :, lo:num], a_h[:, :, lo:num], centers[lo:num], None,
                                  prior, config.top_k, None if keys is None else keys[:, :, lo:num])
        out[:, rows] = choice if lo == 0 else torch.where(choice >= 0, choice + lo, -1)  # position + lo == cell


def _route_fsl(q, kbar_h, a_h, centers, out, config: FreeSoloConfig, prior: RoutingPrior, q_start: int,
               firsts: list[int] | None = None, keys: torch.Tensor | None = None):
    """FS-L: per head `A_i = Recent_W(C_i) ∪ TopP(C_i by a_c)`, the candidates kept by `admit_fsl`.

    The retained set is built from the first block on even when queries start at
    `q_start` (it depends on the whole history); only blocks from `q_start` are scored.
    With `firsts`, the history restarts at each document's first block: its candidates are its own.
    """
    bsz, num_q, heads, dim = q.shape
    cell_size, block_size, recent = config.cell_size, config.block_size, config.recent_cells
    seq = q_start + num_q
    state, num_seen, lo = None, 0, 0
    for start, end in query_blocks(block_size, block_size, seq):
        num = start // cell_size
        if firsts is not None and firsts[start // block_size] != lo:  # a new document: a new history
            lo = firsts[start // block_size]
            state, num_seen = None, lo
        if num <= lo:  # the document's first block: nothing eligible yet
            continue
        new = FSLState(cells=torch.arange(num_seen, num, device=q.device).expand(bsz, heads, -1),
                       a=a_h[:, :, num_seen:num], kbar=kbar_h[:, :, num_seen:num],
                       keys=None if keys is None else keys[:, :, num_seen:num])
        state = admit_fsl(state, new, retained=config.retained_cells, recent=recent)
        num_seen = num
        if start < q_start:
            continue
        rows = slice(start - q_start, end - q_start)
        cells = state.cells
        choice = route_candidates(q[:, rows], start, state.kbar, state.a, centers[cells], state.valid(num, recent),
                                  prior, config.top_k, state.keys)
        chosen = cells[:, None].expand(-1, end - start, -1, -1).gather(-1, choice.clamp_min(0))
        out[:, rows] = torch.where(choice >= 0, chosen, -1)
