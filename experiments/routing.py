"""Does FreeSolo's routing find the cell a copy needs? Routing recall on repeated passages.

FreeSolo's readout always attends over the same K selected cells (K * s tokens) and its local
branch over the same window, whatever the sequence length, so the one part of the model that
sees more at a longer length is routing: top-K of all eligible cells by
`q . kbar / sqrt(d) + lam * a * erf(D / 2 sigma)` (docs/freesolo.md §1.4). A copy from beyond the window
can only be read through the long-range branch, and only when routing selected the cell that
holds the token to copy. This module measures how often it does, per layer:

    recall = fraction of second-copy queries (source beyond the window, its cell eligible)
             whose selected cells include the source's cell

for the best single head and for any head, next to the chance rate `K / |eligible cells|` of
a routing that picks K of the eligible cells at random (for FS-L too: its pruning keeps a
cell available only by key norm, which knows nothing of the copy). Used by `experiments/copy_drill.py
--routing`.

The source's cell is the strictest target. Two looser ones say what a routing that rarely
hits it does select instead, each with its own chance rate (`1 - C(E - m, K) / C(E, K)` for m
of the E eligible cells in the span):
- `passage_*`: a selected cell overlaps the first copy of the passage being copied;
- `reach_*`: a selected cell overlaps `[source, source + layer * window]`, the positions whose
  input to this layer can already hold the source token through the local windows of the
  layers below (layer 0: the source's cell only).

`routing_ablation(model, "random" | "off")` replaces the learned routing of every FreeSolo
layer, in the full-sequence forward (not the decode cache or the sequence-parallel path):
K random eligible cells, or none (the long-range branch then outputs 0, docs/freesolo.md §1.6). If a
model copies as well with random routing as with its own, its copies do not come through
routing.

Legend: B batch, N tokens, H heads, K top_k.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

ABLATIONS = ("random", "off")


def freesolo_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    from fsframework.models.freesolo_attention import FreeSoloAttention

    return [m for m in model.modules() if isinstance(m, FreeSoloAttention)]


@torch.no_grad()
def routing_recall(model: torch.nn.Module, tokens: torch.Tensor, source: torch.Tensor) -> list[dict]:
    """Per FreeSolo layer, how often routing selects the cell of each copied token's source.

    tokens: model input `[B, N]`; source: `[B, N]` input position each query's next token is
    copied from, -1 where none (`repeat_batch_with_sources`). Only queries that must read
    their source through the long-range branch count: further back than the window, in a
    cell eligible for the query's block. Returns one dict per layer with `queries` (how many
    counted), `best_head` / `any_head` recall and `chance`, and the same for the passage and
    the reach spans (`passage_best_head`, ..., `reach_chance`; module docstring)."""
    first_copy = first_copy_start(source)
    return [_recall_record(index, layer, cells, eligible, counted, source, first_copy)
            for index, (layer, _, _, cells, eligible, counted)
            in enumerate(_routed_queries(model, tokens, source, "routing recall"))]


@torch.no_grad()
def readout_source_weight(model: torch.nn.Module, tokens: torch.Tensor, source: torch.Tensor) -> list[dict]:
    """Per FreeSolo layer: when routing did select the source's cell, how much of the readout's
    softmax (NoPE logits `q . k / sqrt(d)` over the K * s selected tokens, docs/freesolo.md §1.6) lands on
    the source token itself? Routing can find the right cell and the readout still average it
    away. Same queries as `routing_recall`. Returns one dict per layer with `pairs` (query-head
    pairs whose selection holds the source), `best_head` (the highest per-head mean weight),
    `mean` (over all pairs) and `uniform` (1 / (K * s): a readout that ignores content)."""
    return [_readout_record(index, layer, q, k, cells, counted, source)
            for index, (layer, q, k, cells, _, counted)
            in enumerate(_routed_queries(model, tokens, source, "the readout weight"))]


@torch.no_grad()
def routing_report(model: torch.nn.Module, tokens: torch.Tensor, source: torch.Tensor) -> list[dict]:
    """Both measurements from one forward pass: per layer, `routing_recall`'s record plus
    `readout_best_head`, `readout_mean`, `readout_pairs` and `readout_chance` (the uniform
    weight) from `readout_source_weight`."""
    first_copy = first_copy_start(source)
    out = []
    for index, (layer, q, k, cells, eligible, counted) in enumerate(_routed_queries(model, tokens, source,
                                                                                    "the routing report")):
        readout = _readout_record(index, layer, q, k, cells, counted, source)
        out.append({**_recall_record(index, layer, cells, eligible, counted, source, first_copy),
                    "readout_best_head": readout["best_head"], "readout_mean": readout["mean"],
                    "readout_pairs": readout["pairs"], "readout_chance": readout["uniform"]})
    return out


def _recall_record(index: int, layer, cells: torch.Tensor, eligible: torch.Tensor, counted: torch.Tensor,
                   source: torch.Tensor, first_copy: torch.Tensor) -> dict:
    """`routing_recall`'s record for one layer (the `index`-th FreeSolo layer)."""
    a = layer.cfg.attention
    n = int(counted.sum())
    positions = torch.arange(source.shape[1], device=source.device)
    passage_length = positions + 1 - source  # a passage of n tokens is copied from n - 1 back
    spans = {"": (source, source + 1),
             "passage_": (first_copy, first_copy + passage_length),
             "reach_": (source, source + index * a.window + 1)}
    record = {"layer": index, "queries": n}
    for prefix, (lo, hi) in spans.items():
        hit, chance = _span_hits(cells[counted], lo[counted], hi[counted], eligible[counted], a.cell_size, a.top_k)
        record.update({f"{prefix}best_head": float(hit.float().mean(dim=0).max()) if n else float("nan"),
                       f"{prefix}any_head": float(hit.any(dim=-1).float().mean()) if n else float("nan"),
                       f"{prefix}chance": float(chance.mean()) if n else float("nan")})
    return record


def _readout_record(index: int, layer, q: torch.Tensor, k: torch.Tensor, cells: torch.Tensor, counted: torch.Tensor,
                    source: torch.Tensor) -> dict:
    """`readout_source_weight`'s record for one layer."""
    a = layer.cfg.attention
    batch, query = counted.nonzero(as_tuple=True)
    chosen = cells[batch, query]  # Q H K
    offsets = torch.arange(a.cell_size, device=source.device)
    keys_at = (chosen.clamp(min=0)[..., None] * a.cell_size + offsets).flatten(2)  # Q H K*s token positions
    valid = (chosen >= 0)[..., None].expand(*chosen.shape, a.cell_size).flatten(2)
    heads = torch.arange(q.shape[2], device=source.device)
    keys = k[batch[:, None, None], keys_at, heads[None, :, None]]  # Q H K*s d
    logits = torch.einsum("qhd,qhld->qhl", q[batch, query].float(), keys.float()) / q.shape[-1] ** 0.5
    weights = logits.masked_fill(~valid, float("-inf")).softmax(dim=-1)
    at_source = keys_at == source[batch, query][:, None, None]
    on_source = (weights * at_source).sum(dim=-1)  # Q H
    selected = (at_source & valid).any(dim=-1)  # Q H: this head's cells hold the source
    per_head = [float(on_source[:, h][selected[:, h]].mean()) for h in range(q.shape[2]) if selected[:, h].any()]
    return {"layer": index, "pairs": int(selected.sum()),
            "best_head": max(per_head) if per_head else float("nan"),
            "mean": float(on_source[selected].mean()) if selected.any() else float("nan"),
            "uniform": 1.0 / (a.top_k * a.cell_size)}


def _routed_queries(model: torch.nn.Module, tokens: torch.Tensor, source: torch.Tensor, what: str):
    """One forward pass, then per FreeSolo layer: (layer, q, k `[B, N, H, d]`, its selected cells
    `[B, N, H, K]`, eligible-cell counts `[B, N]`, the counted queries `[B, N]`: a source
    further back than the window, in a cell eligible for the query's block)."""
    layers = freesolo_layers(model)
    if not layers:
        raise ValueError(f"{what} needs a FreeSolo model (fs, fsl): this one has no routed attention")
    inputs: dict[int, torch.Tensor] = {}
    hooks = [m.register_forward_pre_hook(lambda mod, args: inputs.__setitem__(id(mod), args[0])) for m in layers]
    try:
        model(tokens)
    finally:
        for hook in hooks:
            hook.remove()
    positions = torch.arange(tokens.shape[1], device=tokens.device)
    for layer in layers:
        a = layer.cfg.attention
        q, k, _ = layer.project(inputs[id(layer)])
        eligible = eligible_cells(tokens.shape[1], a.cell_size, a.block_size, tokens.device).expand_as(source)
        counted = (source >= 0) & (positions - source > a.window) & (source // a.cell_size < eligible)
        yield layer, q, k, layer.route(q, k), eligible, counted


def first_copy_start(source: torch.Tensor) -> torch.Tensor:
    """`[B, N]`: for each second-copy query (`source >= 0`), the position where the first copy of
    its passage begins; -1 elsewhere. Within a passage's second copy the sources run on by one,
    and the first predictable target copies the passage's second token, so the copy begins one
    before the source of the run's first query."""
    previous = torch.cat((source.new_full((source.shape[0], 1), -2), source[:, :-1]), dim=1)
    run_begins = (source >= 0) & (previous != source - 1)
    index = torch.arange(source.shape[1], device=source.device).expand_as(source)
    run_first = torch.where(run_begins, index, torch.zeros_like(index)).cummax(dim=1).values
    return torch.where(source >= 0, source.gather(1, run_first) - 1, torch.full_like(source, -1))


def _span_hits(cells: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, eligible: torch.Tensor, cell_size: int,
               top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cells `[Q, H, K]`, token spans `[lo, hi)` and eligible-cell counts `[Q]` -> whether a head
    selected a cell overlapping the span `[Q, H]`, and the chance that K random eligible cells
    do `[Q]`."""
    first, last = lo // cell_size, torch.minimum((hi - 1) // cell_size, eligible - 1)
    hit = ((cells >= first[:, None, None]) & (cells <= last[:, None, None])).any(dim=-1)
    in_span = (last - first + 1).clamp(min=0).double()
    total = eligible.double()
    miss = torch.ones_like(total)  # C(E - m, K) / C(E, K) as a product of K ratios
    for i in range(top_k):  # past E draws every eligible cell is taken: the ratio clamps to 0
        miss = miss * ((total - in_span - i) / (total - i).clamp(min=1)).clamp(min=0)
    return hit, (1 - miss).float()


def eligible_cells(seq_len: int, cell_size: int, block_size: int, device=None) -> torch.Tensor:
    """`[N]`: how many cells each query may route to (the complete cells before its block)."""
    positions = torch.arange(seq_len, device=device)
    return (positions // block_size) * block_size // cell_size


def random_cells(q: torch.Tensor, cell_size: int, block_size: int, top_k: int, generator: torch.Generator) -> torch.Tensor:
    """`[B, N, H, K]`: K distinct cells drawn uniformly from each query's eligible cells (all of
    them, -1 padded, where fewer are eligible), in `select_cells`' format."""
    bsz, n, heads, _ = q.shape
    cells = n // cell_size
    if cells == 0:
        return torch.full((bsz, n, heads, top_k), -1, dtype=torch.long, device=q.device)
    scores = torch.rand(bsz, n, heads, cells, generator=generator).to(q.device)
    allowed = torch.arange(cells, device=q.device) < eligible_cells(n, cell_size, block_size, q.device)[:, None]
    scores = scores.masked_fill(~allowed[None, :, None, :], -1.0)
    top = scores.topk(min(top_k, cells), dim=-1)
    chosen = torch.where(top.values >= 0, top.indices, torch.full_like(top.indices, -1))
    if chosen.shape[-1] < top_k:
        chosen = torch.cat((chosen, chosen.new_full((*chosen.shape[:-1], top_k - chosen.shape[-1]), -1)), dim=-1)
    return chosen


@contextmanager
def routing_ablation(model: torch.nn.Module, mode: str, seed: int = 0) -> Iterator[None]:
    """Within the block, every FreeSolo layer routes to K random eligible cells ("random") or to
    none ("off"); the learned routing is restored on exit."""
    if mode not in ABLATIONS:
        raise ValueError(f"routing ablation must be one of {ABLATIONS}, got {mode!r}")
    layers = freesolo_layers(model)
    if not layers:
        raise ValueError("a routing ablation needs a FreeSolo model (fs, fsl): this one has no routed attention")
    generator = torch.Generator().manual_seed(seed)

    def replacement(layer):
        a = layer.cfg.attention

        def route(q, k, cfg, prior, q_start=0):  # `select_cells`' signature (fsframework.ops.freesolo_driver.Router)
            if q_start:
                raise ValueError("routing ablations replace the routing of whole-sequence forward passes only")
            if mode == "off":
                return torch.full((*q.shape[:3], a.top_k), -1, dtype=torch.long, device=q.device)
            return random_cells(q, a.cell_size, a.block_size, a.top_k, generator)
        return route

    for layer in layers:
        layer.router = replacement(layer)  # the layer's FreeSolo op routes with it (FreeSoloAttention.router)
    try:
        yield
    finally:
        for layer in layers:
            layer.router = None


# read-time routings screened against FS's own (experiments/README.md, "Routing that holds as cells
# multiply"); each replaces a layer's routing like the ablations above (`FreeSoloAttention.router`)
CANDIDATE_ROUTINGS = ("norm-tau", "norm-row-median", "lam-log")


def candidate_router(layer, kind: str):
    """A whole-sequence router for `layer` (`select_cells`' signature) that routes FS's way, by
    `q . kbar / sqrt(d) + lam * a * erf(D / 2 sigma)` over every eligible cell, with one change:

    - "norm-tau": only cells with `a_c >= tau_h` compete, tau_h the layer's calibrated FS-B threshold
      (`fsf calibrate`, set on the layer by `fsframework.models.freesolo_attention.set_fsb_thresholds`):
      FS-B's norm filter inside FS's exact top-K;
    - "norm-row-median": only cells with `a_c` at least the median of the row's eligible cells (the
      same filter with a threshold of the row's own, no calibration);
    - "lam-log": the prior's weight grows with the number E of eligible cells, `lam * max(1, ln E / ln 15)`
      (15: the most cells a query of a 128-token training row sees).
    Fewer than K cells passing a filter leave the remaining slots at -1 (nothing read)."""
    import math

    from fsframework.ops.freesolo_routing import query_blocks, summaries_by_head, top_k_earliest

    if kind not in CANDIDATE_ROUTINGS:
        raise ValueError(f"candidate routing must be one of {CANDIDATE_ROUTINGS}, got {kind!r}")
    if kind == "norm-tau" and not bool(torch.isfinite(layer.tau).all()):
        raise ValueError("norm-tau needs the layer's calibrated thresholds: run `fsf calibrate` and set them")

    def route(q, k, cfg, prior, q_start=0):
        if q_start:
            raise ValueError("candidate routings replace the routing of whole-sequence forward passes only")
        bsz, seq, heads, dim = q.shape
        s = cfg.cell_size
        kbar, a = summaries_by_head(k, s)  # [B, H, C, d], [B, H, C]
        sigma, lam = prior.per_head(heads, like=kbar)
        centers = (torch.arange(seq // s, dtype=kbar.dtype) + 0.5) * s
        out = torch.full((bsz, seq, heads, cfg.top_k), -1, dtype=torch.long, device=q.device)
        for start, end in query_blocks(cfg.block_size, cfg.block_size, seq):
            num = start // s
            content = torch.einsum("bqhd,bhmd->bqhm", q[:, start:end].to(kbar.dtype), kbar[:, :, :num]) / math.sqrt(dim)
            weight = lam * max(1.0, math.log(num) / math.log(15)) if kind == "lam-log" else lam
            pos = torch.arange(start, end, dtype=kbar.dtype)
            prior_score = (weight[:, None] * a[:, :, :num])[:, None] * torch.erf(
                (pos[None, :, None, None] - centers[:num]) / (2 * sigma[:, None]))
            valid = None
            if kind == "norm-tau":
                valid = (a[:, :, :num] >= layer.tau.to(a.dtype)[None, :, None])[:, None]
            elif kind == "norm-row-median":
                valid = (a[:, :, :num] >= a[:, :, :num].median(dim=-1, keepdim=True).values)[:, None]
            out[:, start:end] = top_k_earliest(content + prior_score, valid, cfg.top_k)
        return out
    return route
