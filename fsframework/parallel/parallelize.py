"""`parallelize(model, parallel_cfg)`: the one step that makes a plain model sequence parallel.

Models stay plain modules. Under `parallel.sp > 1` the top-level language model
gets its class swapped in place for a subclass whose forward embeds this rank's
slice only and hands every layer a `SequenceParallelKeys` source, which fetches
the earlier keys each attention kind needs from the other ranks (the pattern of
torch's `fully_shard`): the parameters, their names and the state dict are
untouched, so checkpoints of SP and non-SP runs are interchangeable, and no
attention kind has an SP form of its own.

After parallelize, `model(tokens [B, N])` takes the WHOLE sequence (every rank of
an SP group holds the same sample) and returns the logits of this rank's tokens
`[B, n, V]`; `sp_context(model)` tells which they are (`runs`: one slice, or two
under `parallel.sp_layout=zigzag`, in order).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from fsframework.models.attention import QKVAttention
from fsframework.models.registry import attention_kind
from fsframework.models.transformer import TransformerLM
from fsframework.parallel.attention import RunsAttention, SequenceParallelKeys, ZigzagRunsSource
from fsframework.parallel.context import SPContext
from fsframework.parallel.groups import ParallelGroups, init_groups
from fsframework.parallel.sharding import LAYOUTS, shard_runs


class SPLanguageModel:
    """TransformerLM on the own tokens: embeddings, layers, head and positions of this rank's runs only."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens `[B, N]` (whole sequence) -> logits of this rank's runs `[B, n, V]`, in order."""
        sp: SPContext = self._sp
        sp.begin(tokens.shape[1])
        source = SequenceParallelKeys(sp) if sp.layout == "contiguous" else ZigzagRunsSource(sp)
        return self.lm_head(self.hidden_states(shard_runs(tokens, sp.runs), source))

    def loss(self, tokens, targets, weights=None):
        from fsframework.parallel.loss import sequence_parallel_losses

        return sequence_parallel_losses(self(tokens), targets, weights, self._sp)[0]


class SPOwnLanguageModel(SPLanguageModel):
    """A language model with a sequence-parallel form of its own (`sharded_hidden_states`,
    e.g. AR-GRC's scan, docs/argrc.md §6): the model computes, this layer communicates."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        from fsframework.parallel.scan import root_gatherer

        sp: SPContext = self._sp
        sp.begin(tokens.shape[1])
        return self.lm_head(self.sharded_hidden_states(tokens, sp.slices, sp.rank, root_gatherer(sp)))


_SWAPPED: dict[tuple[type, type], type] = {}


def _swap(module: nn.Module, mixin: type, sp: SPContext) -> None:
    base = type(module)
    if (mixin, base) not in _SWAPPED:
        _SWAPPED[mixin, base] = type(f"SequenceParallel{base.__name__}", (mixin, base), {})
    module.__class__ = _SWAPPED[mixin, base]
    module._sp = sp


def parallelize(model: nn.Module, parallel_cfg, groups: Optional[ParallelGroups] = None,
                block_size: Optional[int] = None) -> nn.Module:
    """Make `model` (a TransformerLM from the registry) sequence parallel over `parallel_cfg.sp` ranks.

    groups: the process groups (default: created here; collective over the world).
    block_size: sharding granularity in tokens (default `model.cfg.attention.block_size`,
    which FreeSolo needs so that no query block straddles two ranks).
    Returns the same module object; a no-op when `sp == 1`.
    """
    sp_size = parallel_cfg.sp
    if sp_size == 1:
        return model
    if getattr(model, "_sp", None) is not None:
        raise ValueError("model is already parallelized")
    own_form = hasattr(model, "sharded_hidden_states")
    if not (own_form or isinstance(model, TransformerLM)):
        raise TypeError(f"sequence parallelism supports the registry's language models, got {type(model).__name__}")
    groups = groups or init_groups(sp_size)
    if groups.sp != sp_size:
        raise ValueError(f"process groups were made for sp={groups.sp}, parallel.sp={sp_size}")
    layout = getattr(parallel_cfg, "sp_layout", "contiguous")
    if layout not in LAYOUTS:
        raise ValueError(f"parallel.sp_layout={layout!r} is not one of {LAYOUTS}")
    if own_form or attention_kind(model.cfg.name).keys != "prefix":
        layout = "contiguous"  # bounded work per query (SWA, FS-L) or a scan of its own (AR-GRC): balanced already
    sp = SPContext(groups=groups, block_size=block_size or model.cfg.attention.block_size, layout=layout)
    for layer in [] if own_form else model.layers:
        if not isinstance(layer.attn, QKVAttention):
            raise TypeError(f"attention {type(layer.attn).__name__} is not in the offset form of "
                            "fsframework.models.attention, so it cannot take keys from other ranks")
        if layout == "zigzag":
            _swap(layer.attn, RunsAttention, sp)
    _swap(model, SPOwnLanguageModel if own_form else SPLanguageModel, sp)
    return model


def sp_context(model: nn.Module) -> Optional[SPContext]:
    """The SPContext of a parallelized model (None for a plain one)."""
    return getattr(model, "_sp", None)
