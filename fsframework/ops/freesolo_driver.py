"""One way to drive a FreeSolo layer's two branches (docs/freesolo.md §1.1-§1.9): a state-passing op.

    local, long_range, state = freesolo(q, k, v, state, cfg, prior, gain)

q, k, v: the layer's unrotated projections `[B, n, H, d]`; cfg its `FreeSoloConfig`, prior its
`RoutingPrior` (`fsframework.ops.freesolo_config`), gain the readout RMSNorm gain `[H, d]`. The
state says what the queries read besides their own keys, and how:

- `None` (training, evaluation): the whole sequence, from position 0; k and v are the queries' own.
- `PrefixKeys(start, cells)` (sequence parallelism; also what `None` means, at start 0): the queries
  sit at `[start, start + n)` and k, v end with their own keys, reaching back over the prefix a
  sequence-parallel rank gathered from the others. With `cells` (routed from gathered summaries), k
  and v may be compact: the cells the queries read, then the window before `start` and the own keys.
- a decode state (`new_decode_state(cfg)`: `FSDecodeState`, `FSLDecodeState`, `FSBDecodeState`,
  `fsframework.ops.freesolo_decode`, `fsb_decode`): the earlier positions as the variant keeps them,
  carried from call to call (token by token, prefill chunk by chunk) and advanced here, block by
  block.

The whole-sequence forms route all query blocks in one call of `select_cells` (its block loop, or
the Triton kernel's), which gives the cells the decode loop gives block after block. Both read out
with the same softmax and RMSNorm (`cell_readout`, `cell_readout_kept`), so every form gives the
logits of one forward pass over the whole sequence (tests/ops/test_freesolo_cache.py,
tests/parallel, tests/models/test_decode_cache.py). Sequence parallelism and the decode caches call
this op; they read nothing of the layer but its config, prior and gain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from fsframework.ops.freesolo import cell_readout, cell_readout_kept, select_cells, unit_gradient_gain
from fsframework.ops.freesolo_config import FreeSoloConfig, RoutingPrior
from fsframework.ops.freesolo_decode import FreeSoloDecodeState, FSDecodeState, FSLDecodeState
from fsframework.ops.freesolo_routing import query_blocks
from fsframework.ops.fsb_decode import FSBDecodeState
from fsframework.ops.offset_attention import window_attention_at


# what routes the queries of a `PrefixKeys` state: `select_cells`' signature, (q, k, cfg, prior, q_start=) -> cells
Router = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class PrefixKeys:
    """The state of queries at `[start, start + n)` that are handed the keys of their prefix (module
    docstring); `cells` `[B, n, H, K]`: routed by whoever gathered the keys (None: route here, with
    `router`, `select_cells` unless a diagnostic replaces it: experiments/routing.py's ablations); from a
    `start` inside a query block, `[B, pad + n, H, K]`, the block's front-padded queries' too."""

    start: int = 0
    cells: Optional[torch.Tensor] = None
    router: Optional[Router] = None


WHOLE_PREFIX = PrefixKeys()

State = Union[None, PrefixKeys, FreeSoloDecodeState]

# the decode state of each routing variant
DECODE_STATES: dict[str, type[FreeSoloDecodeState]] = {"fs": FSDecodeState, "fsl": FSLDecodeState,
                                                      "fsb": FSBDecodeState}


def new_decode_state(cfg: FreeSoloConfig) -> FreeSoloDecodeState:
    """An empty decode state for a layer with settings `cfg` (its routing variant's)."""
    return DECODE_STATES[cfg.variant](cfg)


def freesolo(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: State, cfg: FreeSoloConfig,
             prior: RoutingPrior, gain: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, State]:
    """A FreeSolo layer's branches -> (local, long_range `[B, n, H, d]`, the state after the queries);
    see the module docstring. Gradients reach q, k, v and gain on the `PrefixKeys` forms; a decode
    state is advanced in place and returned."""
    if isinstance(state, FreeSoloDecodeState):
        return (*_decode(q, k, v, state, cfg, prior, gain), state)
    state = WHOLE_PREFIX if state is None else state
    return (*_prefix(q, k, v, state, cfg, prior, gain), state)


def _prefix(q, k, v, state: PrefixKeys, cfg: FreeSoloConfig, prior: RoutingPrior, gain):
    """The branches of queries handed their prefix's keys (`PrefixKeys`)."""
    start, cells, n = state.start, state.cells, q.shape[1]
    if cells is None and k.shape[1] != start + n:
        raise ValueError(f"the long-range branch needs the keys of the whole prefix [0, {start + n}), "
                         f"got {k.shape[1]}")
    own_at = k.shape[1] - n  # where the own keys begin in k: `start`, or later in compact keys
    before = own_at - min(cfg.window, start)
    local = window_attention_at(q, k[:, before:], v[:, before:], start, window=cfg.window,
                                rope_theta=cfg.rope_theta, impl=cfg.impl)
    # routing takes query offsets at block boundaries: a query slice that starts mid-block is
    # front-padded with zero queries back to its block's start, which select the same cells as
    # every query of that block, and their outputs are dropped
    pad = start % cfg.block_size
    if pad:
        if cells is not None and cells.shape[1] != pad + n:
            raise ValueError(f"routed cells of queries from mid-block (start={start}) must cover the {pad} "
                             f"front-padded queries too: {pad + n}, got {cells.shape[1]}")
        q = torch.cat((q.new_zeros((q.shape[0], pad, *q.shape[2:])), q), dim=1)
    if cells is None:
        cells = (state.router or select_cells)(q, k, cfg, prior, q_start=start - pad)
    if cfg.readout_backward == "unit" and gain is not None:  # learns as if read at gain 1 (docs/freesolo.md §1.6)
        long_range = unit_gradient_gain(cell_readout(q, k, v, cells, cfg, q_start=own_at - pad), gain)
    else:
        long_range = cell_readout(q, k, v, cells, cfg, rms_weight=gain, q_start=own_at - pad)
    return local, long_range[:, pad:]


def _decode(q, k, v, state: FreeSoloDecodeState, cfg: FreeSoloConfig, prior: RoutingPrior, gain):
    """The branches of the next positions of a decode state, one query block at a time (the block loop
    of decoding: a block's queries share one available set)."""
    start = state.length
    pieces = list(query_blocks(cfg.block_size, start, start + q.shape[1]))
    if len(pieces) <= 1:  # a decoded token, or a chunk inside one block: no copy
        return _decode_block(q, k, v, start, state, cfg, prior, gain)
    outs = []
    for lo, hi in pieces:
        piece = slice(lo - start, hi - start)
        outs.append(_decode_block(q[:, piece], k[:, piece], v[:, piece], lo, state, cfg, prior, gain))
    return torch.cat([o[0] for o in outs], dim=1), torch.cat([o[1] for o in outs], dim=1)


def _decode_block(q, k, v, start: int, state: FreeSoloDecodeState, cfg: FreeSoloConfig, prior: RoutingPrior,
                  gain):
    """The branches of a piece inside one query block."""
    state.enter_block(start - start % cfg.block_size, cfg, prior)
    local = state.local(q, k, v, start, cfg)
    state.length += q.shape[1]
    if state.num_cells == 0:  # the first block reads nothing long range: exactly 0, as in the full form
        state.selection = (torch.full((*q.shape[:3], cfg.top_k), -1, dtype=torch.long, device=q.device), None)
        return local, torch.zeros_like(q)
    choice, cells_k, cells_v, ids = state.route(q, start, cfg, prior)
    state.selection = (choice, ids)
    return local, cell_readout_kept(q, cells_k, cells_v, choice, rms_weight=gain)
