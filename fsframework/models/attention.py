"""Attention modules of the baseline models (docs/baselines.md), in the offset form.

Every attention module has the same interface: `Module(cfg: ModelConfig, layer_idx,
key_span=None)` and `forward(x [B, n, D], source: KeySource) -> [B, n, D]`, so the
decoder block does not know which kind it holds. A kind writes only
`attend(q, k, v, start)`: its queries sit at `[start, start + n)` and its keys end
with theirs (`fsframework.models.context`). `key_span` (from the kind's registry
entry) is how far back those keys must reach: None for the whole prefix, `w` for a
window.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from fsframework.config import ModelConfig
from fsframework.models.blocks import alibi_slopes
from fsframework.models.context import WHOLE_SEQUENCE, ContinuedDocument, DocumentRows, KeySource, after_earlier
from fsframework.models.documents import Documents
from fsframework.ops.document_attention import (ChunkMasks, chunk_key_starts, document_attention, document_block_mask,
                                                flex_document_attention, uses_flex)
from fsframework.ops.local_attention import sliding_window_attention
from fsframework.ops.offset_attention import alibi_attention_at, causal_attention_at, window_attention_at
from fsframework.ops.rope import rotate, rotate_at


class QKVAttention(nn.Module):
    """Shared projections; subclasses define `attend(q, k, v, start)` on `[B, n, H, Dh]`."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, key_span: Optional[int] = None):
        super().__init__()
        self.cfg = cfg
        self.layer_idx = layer_idx
        self.key_span = key_span
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wo = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def project(self, x: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x `[B, n, D]` at positions `[start, start + n)` -> q, k, v `[B, n, H, Dh]`, in the form
        the keys are stored and exchanged in (RoPE kinds rotate here, at absolute positions)."""
        bsz, seq, _ = x.shape
        shape = (bsz, seq, self.n_heads, self.head_dim)
        return self.wq(x).view(shape), self.wk(x).view(shape), self.wv(x).view(shape)

    def qkv(self, x: torch.Tensor, source: KeySource) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Own queries and the keys/values `source` supplies for them (see module docstring)."""
        q, k, v = self.project(x, source.start)
        k, v = source.keys(self.layer_idx, k, v, self.key_span)
        return q, k, v

    def forward(self, x: torch.Tensor, source: KeySource = WHOLE_SEQUENCE) -> torch.Tensor:
        """x `[B, n, D]` -> `[B, n, D]`: the offset form (`forward_run`) once per run of `source`, one
        except on a rank of the zigzag layout (`fsframework.parallel.attention.ZigzagRunsSource`).
        The runs stay inside this one module call, so ZeRO-3 gathers the projections once for all."""
        if source.documents is not None:  # packed documents, each read as its own row
            return self.forward_documents(x, source)
        runs = source.runs(x)
        if len(runs) == 1:
            return self.forward_run(*runs[0])
        return torch.cat([self.forward_run(piece, run_source) for piece, run_source in runs], dim=1)

    def forward_documents(self, x: torch.Tensor, source: DocumentRows) -> torch.Tensor:
        """x `[B, n, D]` of packed rows (`source.documents`): each document that starts here in the
        whole-sequence form; a run's first piece that continues a document begun before the run (a
        sequence-parallel rank's) in the offset form at its position in the document, over the keys
        this layer projects from the document's earlier tokens (`earlier_tokens`: the same projection,
        RoPE at the document's positions `[0, start)`, so the same keys as one process's)."""
        # on every rank, whatever its rows hold: under sequence parallelism these are exchanges
        exchanged, keys = source.continued_keys(x, self.key_span, self.project, self)
        documents = source.documents

        def continue_piece(i: int, piece: torch.Tensor, start: int) -> torch.Tensor:
            return self.forward_run(piece, ContinuedDocument(start, *keys[i]))  # FS routed: (k, v, cells)

        if not self.reads_packed_rows or documents.whole_rows:
            y = documents.map(lambda rows: self.forward_run(rows, WHOLE_SEQUENCE), x, continue_piece)
        elif not documents.continuations:
            y = self.forward_packed_rows(x, documents)
        else:  # the documents that start here in one call, laid end to end; each continued piece on its own
            y = documents.map_packed(lambda flat: self.forward_packed_rows(flat[None], documents.plain_documents)[0],
                                     x, continue_piece)
        for earlier in exchanged:
            y = after_earlier(y, earlier)
        return y

    # the kind reads packed rows in one call (`attend_documents`, every document at once); otherwise
    # `Documents.map` runs its whole-sequence form once per distinct document length
    reads_packed_rows = False

    # the kind routes from cells' summaries alone (FS, FS-L), so a source may route its continued pieces from
    # summaries another rank sends (`fsframework.parallel.document_selected`, `document_retained`)
    routes_from_summaries = False

    def forward_packed_rows(self, x: torch.Tensor, documents: Documents) -> torch.Tensor:
        """x `[B, T, D]` of packed rows that each begin a document -> `[B, T, D]`, every document read as a
        row of its own (queries, keys and positions its own) in one `attend_documents` call."""
        q, k, v = self.project_documents(x, documents.positions)
        y = self.attend_documents(q, k, v, documents)
        return self.wo(y.reshape(x.shape))

    def project_documents(self, x: torch.Tensor, positions: torch.Tensor):
        """`project` for packed rows, tokens at their document positions `[B, T]`: unrotated here."""
        return QKVAttention.project(self, x)

    def attend_documents(self, q, k, v, documents: Documents):  # pragma: no cover - kinds that read packed rows
        raise NotImplementedError

    def forward_run(self, x: torch.Tensor, source: KeySource) -> torch.Tensor:
        """The offset form on one contiguous run `x` `[B, n, D]` at `[source.start, source.start + n)`."""
        q, k, v = self.qkv(x, source)
        y = self.attend(q, k, v, source.start)
        return self.wo(y.reshape(x.shape))

    def attend(self, q, k, v, start):  # pragma: no cover - abstract
        raise NotImplementedError

    def reset_extra_parameters(self) -> None:
        """Re-initialise parameters other than Linear weights (`TransformerLM.reset_parameters`): none here."""


class RopeAttention(QKVAttention):
    """Transformer++: full causal attention; q and k rotated at their absolute positions
    before the keys are exchanged or cached."""

    def project(self, x, start=0):
        q, k, v = super().project(x, start)
        theta = self.cfg.attention.rope_theta
        return rotate(q, theta, start), rotate(k, theta, start), v

    def attend(self, q, k, v, start):
        return causal_attention_at(q, k, v, start)

    reads_packed_rows = True

    def project_documents(self, x, positions):
        q, k, v = QKVAttention.project(self, x)
        theta = self.cfg.attention.rope_theta
        return rotate_at(q, theta, positions), rotate_at(k, theta, positions), v

    def attend_documents(self, q, k, v, documents):
        return dense_documents(self.cfg.attention.impl, q, k, v, documents)


class SlidingWindowAttention(QKVAttention):
    """SWA baseline: RoPE attention restricted to `0 <= i - j <= window` (docs/freesolo.md §1.2 rule).

    Its keys are exchanged unrotated and rotated inside the window op (the Triton kernel fuses
    RoPE), except in a source that keeps them (a decode cache, docs/decoding.md): there they are
    rotated once, before they are kept, so a decoded token does not re-rotate the whole window."""

    def forward_run(self, x: torch.Tensor, source: KeySource) -> torch.Tensor:
        theta = self.cfg.attention.rope_theta
        if not source.keeps_keys or theta is None:
            return super().forward_run(x, source)
        start = source.start
        q, k, v = self.project(x, start)
        # the same rotation at the same absolute positions as the op's: the same numbers
        q, k = rotate(q, theta, start), rotate(k, theta, start)
        k, v = source.keys(self.layer_idx, k, v, self.key_span)
        return self.wo(self.attend(q, k, v, start, rotated=True).reshape(x.shape))

    def attend(self, q, k, v, start, rotated: bool = False):
        """`rotated`: q and k already carry RoPE at their absolute positions."""
        a = self.cfg.attention
        return window_attention_at(q, k, v, start, window=a.window, rope_theta=None if rotated else a.rope_theta,
                                   impl=a.impl)

    reads_packed_rows = True

    def attend_documents(self, q, k, v, documents):
        """q, k, v unrotated: the window op rotates them at the document positions and keeps each
        query to its own document's keys (one call, the Triton kernel's one launch each way)."""
        a = self.cfg.attention
        return sliding_window_attention(q, k, v, window=a.window, rope_theta=a.rope_theta, impl=a.impl,
                                        positions=documents.positions)


class NoPositionAttention(QKVAttention):
    """Plain causal attention; used by the sinusoidal model, whose positions live in the embedding."""

    def attend(self, q, k, v, start):
        return causal_attention_at(q, k, v, start)

    reads_packed_rows = True

    def attend_documents(self, q, k, v, documents):
        return dense_documents(self.cfg.attention.impl, q, k, v, documents)


class AlibiAttention(QKVAttention):
    """Causal attention with the ALiBi bias `-slope_h * (i - j)`, chunked over queries so the
    bias never exceeds `chunk x T` per head."""

    chunk = 512

    def __init__(self, cfg: ModelConfig, layer_idx: int, key_span: Optional[int] = None):
        super().__init__(cfg, layer_idx, key_span)
        self.register_buffer("slopes", alibi_slopes(cfg.n_heads), persistent=False)

    def attend(self, q, k, v, start):
        return alibi_attention_at(q, k, v, start, self.slopes, self.chunk)

    reads_packed_rows = True

    def attend_documents(self, q, k, v, documents):
        return dense_documents(self.cfg.attention.impl, q, k, v, documents, self.slopes)


def dense_documents(impl: str, q, k, v, documents: Documents, slopes: Optional[torch.Tensor] = None):
    """A dense kind's packed documents in one call: FlexAttention with the batch's document `BlockMask` on
    a GPU (`uses_flex`), else fused SDPA per query chunk with the batch's masks
    (`fsframework.ops.document_attention`; ALiBi's bias with `slopes`). Either table is built once per
    batch and shared by every layer."""
    if uses_flex(q, impl):
        mask = documents.derived("flex_block_mask", lambda: document_block_mask(documents.positions))
        return flex_document_attention(q, k, v, mask, slopes)
    return document_attention(q, k, v, documents.positions, masks=_chunk_masks(documents, q.dtype, slopes))


def _chunk_masks(documents: Documents, dtype: torch.dtype, slopes: Optional[torch.Tensor] = None) -> ChunkMasks:
    """The batch's `ChunkMasks` (ALiBi's with `slopes`): built once, read by every layer, forward and
    backward; their chunks' key starts come from the host positions (no device sync)."""
    def build() -> ChunkMasks:
        return ChunkMasks(documents.positions, chunk_key_starts(documents.host_positions), slopes, dtype)

    return documents.derived(f"attention_masks:{dtype}:{'alibi' if slopes is not None else 'causal'}", build)
