"""`parallelize(model, parallel_cfg)`: the one step that makes a plain model sequence parallel.

Models stay plain modules. Under `parallel.sp > 1` the top-level language model
gets its class swapped in place for a subclass whose forward embeds this rank's
slice only and hands every layer a `SequenceParallelKeys` source, which fetches
the earlier keys each attention kind needs from the other ranks (the pattern of
torch's `fully_shard`): the parameters, their names and the state dict are
untouched, so checkpoints of SP and non-SP runs are interchangeable, and no
attention kind has an SP form of its own.

After parallelize, `sp_context(model)` is the model's context (group, block size,
layout). Every rank of an SP group reads the same sample; `fsframework.parallel.batch.shard_batch`
cuts its inputs and targets to this rank's runs (one slice, or two under
`parallel.sp_layout=zigzag`, in order) and gives the context of that sequence length, and
`model(own_tokens [B, n], sequence_context)` returns the logits of those tokens `[B, n, V]`.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from fsframework.models.attention import QKVAttention
from fsframework.models.losses import head_output
from fsframework.models.registry import attention_kind
from fsframework.models.transformer import TransformerLM
from fsframework.parallel.attention import RunsAttention, SequenceParallelKeys, ZigzagRunsSource
from fsframework.parallel.context import SPContext
from fsframework.parallel.groups import ParallelGroups, init_groups
from fsframework.parallel.sharding import LAYOUTS


def _sequence_context(model: nn.Module, sp: Optional[SPContext]) -> SPContext:
    if sp is None or not sp.all_runs:
        raise TypeError(f"the sequence-parallel {type(model).__name__} takes this rank's tokens and the SPContext "
                        "of their sequence: model(*fsframework.parallel.batch.shard_batch(...)) (RankBatch.logits)")
    return sp


class SPLanguageModel:
    """TransformerLM on the own tokens: embeddings, layers, head and positions of this rank's runs only."""

    def forward(self, tokens: torch.Tensor, sp: Optional[SPContext] = None, targets: Optional[torch.Tensor] = None,
                loss_chunk: int = 0) -> torch.Tensor:
        """tokens of this rank's runs `[B, n]`, `sp` the context of their sequence -> their logits `[B, n, V]`
        (given their `targets`, the per-token losses `[B, n]`, as the plain model's forward)."""
        sp = _sequence_context(self, sp)
        source = SequenceParallelKeys(sp) if sp.layout == "contiguous" else ZigzagRunsSource(sp)
        return head_output(self.lm_head, self.hidden_states(tokens, source), targets, loss_chunk)


class SPOwnLanguageModel(SPLanguageModel):
    """A language model with a sequence-parallel form of its own (`sharded_hidden_states`,
    e.g. AR-GRC's scan, docs/argrc.md §6): the model computes, this layer communicates."""

    def forward(self, tokens: torch.Tensor, sp: Optional[SPContext] = None, targets: Optional[torch.Tensor] = None,
                loss_chunk: int = 0) -> torch.Tensor:
        from fsframework.parallel.scan import root_gatherer

        sp = _sequence_context(self, sp)
        hidden = self.sharded_hidden_states(tokens, sp.slices, sp.rank, root_gatherer(sp))
        return head_output(self.lm_head, hidden, targets, loss_chunk)


_SWAPPED: dict[tuple[type, type], type] = {}


def _swap(module: nn.Module, mixin: type) -> None:
    base = type(module)
    if (mixin, base) not in _SWAPPED:
        _SWAPPED[mixin, base] = type(f"SequenceParallel{base.__name__}", (mixin, base), {})
    module.__class__ = _SWAPPED[mixin, base]


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
            _swap(layer.attn, RunsAttention)
    _swap(model, SPOwnLanguageModel if own_form else SPLanguageModel)
    model._sp = sp  # the group, block size and layout: constant for the model's life
    return model


def sp_context(model: nn.Module) -> Optional[SPContext]:
    """The SPContext of a parallelized model (None for a plain one): its group, block size and
    layout, without a sequence (`shard_batch` takes it for each batch's length)."""
    return getattr(model, "_sp", None)
