"""`parallelize(model, parallel_cfg)`: the one step that makes a plain model sequence parallel.

Models stay plain modules of their own class. Under `parallel.sp > 1` the language model
is handed a `SequenceParallel` object (`LanguageModel.enable_sequence_parallel`): from then
on its forward embeds this rank's runs only and, for every sequence, asks that object for
what the other ranks hold: a Transformer hands every layer a `SequenceParallelKeys` source
(or `ZigzagRunsSource`), which fetches the earlier keys each attention kind needs from the
other ranks; AR-GRC gathers its block roots (`fsframework.parallel.scan`). The parameters,
their names and the state dict are untouched, so checkpoints of SP and non-SP runs are
interchangeable, and no attention kind has an SP form of its own.

After parallelize, `sp_context(model)` is the model's context (group, block size,
layout). Every rank of an SP group reads the same sample; `fsframework.parallel.batch.shard_batch`
cuts its inputs and targets to this rank's runs (one slice, or two under
`parallel.sp_layout=zigzag`, in order) and gives the context of that sequence length, and
`model(own_tokens [B, n], sp=sequence_context)` returns the logits of those tokens `[B, n, V]`.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from fsframework.models.context import DocumentRows, KeySource
from fsframework.models.language_model import LanguageModel
from fsframework.parallel.attention import SequenceParallelKeys, ZigzagRunsSource
from fsframework.parallel.context import SPContext
from fsframework.parallel.documents import document_rows
from fsframework.parallel.groups import ParallelGroups, init_groups
from fsframework.parallel.scan import root_gatherer
from fsframework.parallel.sharding import LAYOUTS


class SequenceParallel:
    """What a sequence-parallel model holds (`fsframework.models.language_model.SequenceParallelism`):
    its context, and for each sequence the sources of the other ranks' part."""

    def __init__(self, context: SPContext):
        self.context = context  # the group, block size and layout: constant for the model's life

    def sequence(self, sp: Optional[SPContext], model_name: str) -> SPContext:
        if sp is None or not sp.all_runs:
            raise TypeError(f"the sequence-parallel {model_name} takes this rank's tokens and the SPContext of "
                            "their sequence: model(*fsframework.parallel.batch.shard_batch(...)) (RankBatch.logits)")
        return sp

    def key_source(self, sp: SPContext) -> KeySource:
        return SequenceParallelKeys(sp) if sp.layout == "contiguous" else ZigzagRunsSource(sp)

    def root_gatherer(self, sp: SPContext) -> Callable[[torch.Tensor], list[torch.Tensor]]:
        return root_gatherer(sp)

    def document_rows(self, sp: SPContext, doc_ids: torch.Tensor, device=None) -> DocumentRows:
        return document_rows(sp, doc_ids, device)


def parallelize(model: LanguageModel, parallel_cfg, groups: Optional[ParallelGroups] = None) -> LanguageModel:
    """Make `model` (a language model from the registry) sequence parallel over `parallel_cfg.sp` ranks.

    groups: the process groups (default: created here; collective over the world).
    The sharding granularity is the model's own `model.cfg.attention.block_size`, which
    FreeSolo needs so that no query block straddles two ranks; the model config is the one
    place it is set (docs/freesolo.md §1.3).
    Packed documents read apart (`data.document_masking`) take either layout
    (`fsframework.parallel.documents`: zigzag cuts a long document into an early and a late run per
    rank, as it cuts an unmasked row, so the ranks' work stays balanced whatever the documents).
    Returns the same module object; a no-op when `sp == 1`.
    """
    sp_size = parallel_cfg.sp
    if sp_size == 1:
        return model
    if not isinstance(model, LanguageModel):
        raise TypeError(f"sequence parallelism supports the registry's language models, got {type(model).__name__}")
    if model.parallelism is not None:
        raise ValueError("model is already parallelized")
    groups = groups or init_groups(sp_size)
    if groups.sp != sp_size:
        raise ValueError(f"process groups were made for sp={groups.sp}, parallel.sp={sp_size}")
    layout = getattr(parallel_cfg, "sp_layout", "contiguous")
    if layout not in LAYOUTS:
        raise ValueError(f"parallel.sp_layout={layout!r} is not one of {LAYOUTS}")
    if layout not in model.sequence_layouts():
        # bounded work per query (SWA, FS-L) or a scan of its own (AR-GRC): balanced already
        layout = "contiguous"
    sp = SPContext(groups=groups, block_size=model.cfg.attention.block_size, layout=layout)
    model.enable_sequence_parallel(SequenceParallel(sp))
    return model


def sp_context(model: LanguageModel) -> Optional[SPContext]:
    """The SPContext of a parallelized model (None for a plain one): its group, block size and
    layout, without a sequence (`shard_batch` takes it for each batch's length)."""
    return None if model.parallelism is None else model.parallelism.context
