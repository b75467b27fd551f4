"""`LanguageModel`: the one interface of every model the registry builds (docs/architecture.md,
"The model tier").

A model is tokens -> final hidden states -> output head. What differs between models is how
hidden states are computed (a stack of decoder blocks around an attention kind, AR-GRC's tree
scan), how a rank computes its part of them under sequence parallelism, and what a decoding
step keeps of the past. Callers (the trainer, sequence parallelism, decoding, evaluation,
export) ask the model through this interface only, never by probing its attributes:

- `forward(tokens, targets=None, loss_chunk=0, sp=None, doc_ids=None)`: logits, or the targets'
  per-token losses (`fsframework.models.losses.head_output`); under sequence parallelism `tokens`
  are this rank's runs and `sp` the context of their sequence; `doc_ids` `[B, T]` (packed
  documents, a document a run of equal ids) reads each document as a row of its own
  (`fsframework.models.documents`).
- `hidden_states(tokens, documents=None)`: the final hidden states of a whole sequence (the output
  head's input).
- `decode_state(chunk)`: a fresh cached-decoding state (`fsframework.models.decode_state`).
- `enable_sequence_parallel(parallelism)`: from then on `forward` computes this rank's part; the
  model holds the `SequenceParallelism` object, its class stays what it is.
- `enable_activation_checkpointing()`, `zero3_leaf_modules()`, `recomputed_blocks()`,
  `decoder_blocks()`, `shape_summary()`: the facts training needs.

The communication of sequence parallelism lives in `fsframework.parallel`, which models do
not import (tests/test_layering.py): the model calls back into the `SequenceParallelism`
object it was given.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Optional, Protocol

import torch
from torch import nn

from fsframework.config import ModelConfig
from fsframework.models.context import DocumentRows, KeySource
from fsframework.models.decode_state import DecodeState
from fsframework.models.documents import Documents, documents_of
from fsframework.models.losses import head_output


class SequenceParallelism(Protocol):
    """What a sequence-parallel model holds (made by `fsframework.parallel.parallelize`): the
    rank's context, and the sources of what the other ranks computed, for one sequence."""

    @property
    def context(self):
        """The `SPContext` of the group (its group, block size and layout), without a sequence."""

    def sequence(self, sp, model_name: str):
        """`sp`, the context of the sequence handed to `forward`, checked (TypeError without one)."""

    def key_source(self, sp) -> KeySource:
        """The `KeySource` of the earlier ranks' keys for the sequence `sp` (per the layout)."""

    def root_gatherer(self, sp) -> Callable[[torch.Tensor], list[torch.Tensor]]:
        """Own block roots `[K, B, D]` -> every rank's `[K_r, B, D]` (AR-GRC's scan, docs/argrc.md §6)."""

    def document_rows(self, sp, doc_ids: torch.Tensor, device=None) -> DocumentRows:
        """The documents of this rank's part of rows whose documents are `doc_ids` `[B, N]` (the whole
        rows: a part may begin inside a document), each read as a row of its own, a continued one
        reading its earlier tokens from the other ranks (`DocumentRows.earlier_tokens`); their tables
        on `device` (the rows'), built from doc_ids on the host."""


class LanguageModel(nn.Module, ABC):
    """Base of the registry's language models; see the module docstring."""

    cfg: ModelConfig
    embed: nn.Embedding  # token ids -> embeddings (the export's input embeddings)
    lm_head: nn.Linear  # final hidden states -> logits (tied to `embed` under model.tie_embeddings)
    fsb_calibration_file: Optional[str] = None  # FS-B: the thresholds' file loading read (checkpoints.loading)

    def __init__(self):
        super().__init__()
        self.parallelism: Optional[SequenceParallelism] = None  # set by enable_sequence_parallel

    # --- computing ---

    @abstractmethod
    def hidden_states(self, tokens: torch.Tensor, *, documents: Optional[Documents] = None) -> torch.Tensor:
        """tokens `[B, T]` of a whole sequence -> final hidden states `[B, T, E]`; `documents`: the rows'
        packed documents, each read as a row of its own (None: each row is one sequence)."""

    @abstractmethod
    def sequence_parallel_hidden_states(self, tokens: torch.Tensor, sp,
                                        rows: Optional[DocumentRows] = None) -> torch.Tensor:
        """This rank's tokens `[B, n]` of the sequence `sp` -> their hidden states `[B, n, E]`, equal to
        the single-process ones (the earlier ranks' part comes through `self.parallelism`); `rows`: the
        documents of the rank's part (document masking, `SequenceParallelism.document_rows`)."""

    def forward(self, tokens: torch.Tensor, targets: Optional[torch.Tensor] = None, loss_chunk: int = 0,
                sp=None, doc_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """tokens `[B, T]` -> logits `[B, T, V]`; given `targets` `[B, T]`, their per-token losses
        `[B, T]` instead, the head run `loss_chunk` positions at a time (`models.losses.head_output`).
        Sequence parallel: tokens of this rank's runs `[B, n]`, `sp` the context of their sequence.
        doc_ids `[B, T]`: the documents packed in each row (a document is a run of equal ids), each
        read as a row of its own (document masking, docs/training.md); None: a row is one document.
        Under sequence parallelism they are the whole rows' `[B, N]`, whose part the rank holds."""
        if self.parallelism is None:
            if sp is not None:
                raise TypeError(f"{type(self).__name__} is not sequence parallel: it takes no sequence context")
            if doc_ids is not None and tuple(doc_ids.shape) != tuple(tokens.shape):
                raise ValueError(f"doc_ids must have the tokens' shape {tuple(tokens.shape)}, got {tuple(doc_ids.shape)}")
            hidden = self.hidden_states(tokens, documents=documents_of(doc_ids, tokens.device))
        else:
            sp = self.parallelism.sequence(sp, type(self).__name__)
            rows = None if doc_ids is None else self.parallelism.document_rows(sp, doc_ids, tokens.device)
            hidden = self.sequence_parallel_hidden_states(tokens, sp, rows)
        return head_output(self.lm_head, hidden, targets, loss_chunk)

    # --- decoding ---

    @abstractmethod
    def decode_state(self, chunk: Optional[int] = None) -> DecodeState:
        """A fresh cached-decoding state (docs/decoding.md); `chunk`: prefill positions per step."""

    def decodable(self) -> bool:
        """Whether `decode_state` serves this model: not sequence parallel (a rank holds a slice only)."""
        return self.parallelism is None

    # --- training ---

    def enable_sequence_parallel(self, parallelism: SequenceParallelism) -> None:
        """From now on `forward` takes this rank's tokens and their sequence's context."""
        if self.parallelism is not None:
            raise ValueError("model is already parallelized")
        self.parallelism = parallelism

    def sequence_layouts(self) -> tuple[str, ...]:
        """The sequence-parallel layouts worth running (`fsframework.parallel.sharding`): the zigzag
        layout balances work that grows with position; a model whose work does not keeps contiguous."""
        return ("contiguous",)

    @abstractmethod
    def enable_activation_checkpointing(self) -> None:
        """Recompute the `recomputed_blocks` in backward (`fsframework.models.recompute`)."""

    @abstractmethod
    def recomputed_blocks(self) -> list[nn.Module]:
        """The modules whose calls activation checkpointing recomputes."""

    def decoder_blocks(self) -> list[nn.Module]:
        """The decoder blocks that `train.compile` compiles one by one (none: not a block model)."""
        return []

    @abstractmethod
    def zero3_leaf_modules(self, documents: bool = False) -> list[type]:
        """Module classes ZeRO-3 gathers whole at each call (`fsframework.parallel.deepspeed_config`);
        `documents`: packed documents are read apart (`data.document_masking`), so a sequence-mixing module
        runs its inner modules once per document length, a number that differs between ranks."""

    @abstractmethod
    def shape_summary(self) -> str:
        """The model's shape for the training log (e.g. ", 12 layers, d_model 768, 12 heads")."""
