"""Does FreeSolo's routing find the cell a copy needs? Routing recall on repeated passages.

FreeSolo's readout always attends over the same K selected cells (K * s tokens) and its local
branch over the same window, whatever the sequence length, so the one part of the model that
sees more at a longer length is routing: top-K of all eligible cells by
`q . kbar / sqrt(d) + lam * a * erf(D / 2 sigma)` (SPEC §1.4). A copy from beyond the window
can only be read through the long-range branch, and only when routing selected the cell that
holds the token to copy. This module measures how often it does, per layer:

    recall = fraction of second-copy queries (source beyond the window, its cell eligible)
             whose selected cells include the source's cell

for the best single head and for any head, next to the chance rate `K / |eligible cells|` of
a routing that picks K of the eligible cells at random (for FS-L too: its pruning keeps a
cell available only by key norm, which knows nothing of the copy). Used by `tools/copy_drill.py --routing`.

Legend: B batch, N tokens, H heads, K top_k.
"""

from __future__ import annotations

import torch

from fsframework.ops.freesolo import select_cells


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
    counted), `best_head` / `any_head` recall and `chance`."""
    layers = freesolo_layers(model)
    if not layers:
        raise ValueError("routing recall needs a FreeSolo model (fs, fsl): this one has no routed attention")
    inputs: dict[int, torch.Tensor] = {}
    hooks = [m.register_forward_pre_hook(lambda mod, args: inputs.__setitem__(id(mod), args[0])) for m in layers]
    try:
        model(tokens)
    finally:
        for hook in hooks:
            hook.remove()
    out = []
    for index, layer in enumerate(layers):
        a, name = layer.cfg.attention, layer.cfg.name
        q, k, _ = layer.project(inputs[id(layer)])
        cells = select_cells(q, k, variant=name, cell_size=a.cell_size, block_size=a.block_size, top_k=a.top_k,
                             sigma=layer.sigma, lam=layer.lam, recent_cells=a.recent_cells,
                             retained_cells=a.retained_cells, impl=a.impl)  # B N H K
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        eligible = (positions // a.block_size) * a.block_size // a.cell_size  # cells ending before the block
        src_cell = torch.div(source, a.cell_size, rounding_mode="floor")
        counted = (source >= 0) & (positions - source > a.window) & (src_cell < eligible)
        hit = (cells == src_cell[..., None, None]).any(dim=-1)[counted]  # queries x H
        eligible_counted = eligible.expand_as(source)[counted].float()
        n = int(counted.sum())
        out.append({"layer": index, "queries": n,
                    "best_head": float(hit.float().mean(dim=0).max()) if n else float("nan"),
                    "any_head": float(hit.any(dim=-1).float().mean()) if n else float("nan"),
                    "chance": float((a.top_k / eligible_counted).clamp(max=1.0).mean()) if n else float("nan")})
    return out
