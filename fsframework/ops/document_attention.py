"""Causal attention over packed documents in one call per query chunk (docs/training.md, "Documents").

Legend: B rows, T positions, H heads, d head width, C queries per chunk.

A row packs documents; `positions` `[B, T]` is each token's position inside its document (0 at
its start). Query `i` of a row reads the keys `j` of its own document, `i - positions[i] <= j <= i`,
exactly as if the document were a row of its own: RoPE and ALiBi depend only on `i - j`, and the
caller rotates q and k at the document positions (`fsframework.ops.rope.rotate_at`), so the
logits are the ones the document alone gives.

Queries go in chunks of `C` (`chunk_size`: `T / 16`, between 32 and 256). A chunk `[a, b)` reads the keys `[s, b)`, `s` the earliest document
start among its queries in any row (its first query's, documents being runs: `a - max_rows
positions[:, a]`), with an additive mask `[B, 1, C, b - s]` that keeps each query to its document.
Each chunk is one fused attention call (SDPA takes the mask on the CPU's flash kernel and the GPU's
memory-efficient one), so a layer makes `T / C` calls whatever the number of documents, each
scoring `C x (b - s)` pairs: far fewer than the causal row's when documents are short (`C` plus
the longest document reaching into the chunk, per query), and for one document as long as the
row, `T^2 / 2 + T C / 2`: the causal square and at most 1/16 more (the chunks' diagonal tiles are
scored whole). The chunk starts come from
the positions on the host (`host_positions`), so a CUDA step asks the device nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

def chunk_size(length: int) -> int:
    """Queries per call for rows of `length`: `length / 16` (a long document's extra scores, the
    chunks' diagonal tiles, stay within 1/16 of its causal square) rounded to a power of two, at
    least 32 (fewer would be calls too small to fill a kernel) and at most 256 (the mask and ALiBi
    bias, `B H C (C + reach)`, stay small)."""
    return min(256, max(32, 1 << max(length // 16, 1).bit_length() - 1))


def chunk_key_starts(host_positions: torch.Tensor, chunk: int | None = None) -> list[int]:
    """For each query chunk `[a, a + chunk)` (`chunk_size` by default) of rows with document positions
    `host_positions` `[B, T]` (on the CPU), the first key any of its queries reads:
    `max(0, a - max_rows positions[:, a])`."""
    if host_positions.dim() != 2:
        raise ValueError(f"positions must be [B, T], got shape {tuple(host_positions.shape)}")
    chunk = chunk or chunk_size(host_positions.shape[1])
    firsts = torch.arange(0, host_positions.shape[1], chunk)
    reach = host_positions[:, firsts].amax(0)
    return (firsts - reach).clamp_min(0).tolist()


def document_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, *,
                       key_starts: list[int] | None = None, slopes: torch.Tensor | None = None,
                       masks: "ChunkMasks | None" = None) -> torch.Tensor:
    """Causal attention of q, k, v `[B, T, H, d]` (q, k already rotated where the kind rotates) with each
    query reading its own document's keys only (module docstring). `positions` `[B, T]` on the rows'
    device; `key_starts`: `chunk_key_starts` of them (computed here from `positions` when not given,
    which on CUDA reads them back to the host). `slopes` `[H]`: ALiBi's bias `-slope_h (i - j)`.
    `masks`: the chunks' masks of these positions (and slopes), built once for every layer of a batch
    (`ChunkMasks`); built here when not given."""
    bsz, length = q.shape[:2]
    if positions.shape != (bsz, length) or k.shape[:2] != (bsz, length) or v.shape[:2] != (bsz, length):
        raise ValueError(f"q, k, v [B, T, H, d] and positions [B, T] must share B, T: q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}, positions {tuple(positions.shape)}")
    if masks is None:
        if key_starts is None:
            key_starts = chunk_key_starts(positions.cpu())
        masks = ChunkMasks(positions, key_starts, slopes, q.dtype)
    # B T H D -> B H T D for SDPA
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    if qh.device.type == "cpu" and torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        out = _CPUChunks.apply(qh, kh, vh, masks)
    else:
        out = torch.cat([F.scaled_dot_product_attention(qh[:, :, a:b], kh[:, :, start:b], vh[:, :, start:b],
                                                        attn_mask=masks(c)) for c, (a, b, start) in
                         enumerate(masks.spans)], dim=2)
    return out.transpose(1, 2)


KEPT_MASK_ELEMENTS = 1 << 24  # masks kept for every layer of a batch up to this size (64 MiB in fp32)


class ChunkMasks:
    """Each query chunk's span `(a, b, first key)` and additive mask `[B, 1 or H, n, m]` (-inf outside
    the query's document and the causal triangle; ALiBi's bias added with `slopes`) for rows with
    document positions `positions` `[B, T]`. The masks are the same for every layer of a batch: they
    are built on first use and kept (forward and backward of every layer read them), unless all of them
    together exceed `KEPT_MASK_ELEMENTS`; then each call builds its own."""

    def __init__(self, positions: torch.Tensor, key_starts: list[int], slopes: torch.Tensor | None,
                 dtype: torch.dtype):
        length = positions.shape[1]
        chunk = chunk_size(length)
        if len(key_starts) != -(-length // chunk):
            raise ValueError(f"key_starts must give one start per chunk of {chunk} of {length} queries, "
                             f"got {len(key_starts)}")
        self.positions, self.slopes, self.dtype = positions, slopes, dtype
        self.spans = [(a, min(a + chunk, length), start) for a, start in zip(range(0, length, chunk), key_starts)]
        heads = 1 if slopes is None else slopes.numel()
        elements = positions.shape[0] * heads * sum((b - a) * (b - start) for a, b, start in self.spans)
        self.kept: list | None = [None] * len(self.spans) if elements <= KEPT_MASK_ELEMENTS else None

    def __call__(self, c: int) -> torch.Tensor:
        if self.kept is not None and self.kept[c] is not None:
            return self.kept[c]
        a, b, start = self.spans[c]
        device = self.positions.device
        i = torch.arange(a, b, device=device)
        j = torch.arange(start, b, device=device)
        # key j is the query's own document's, at or before it: 0 <= j - first_i <= pos_i
        offset = j[None, None, :] - (i - self.positions[:, a:b])[:, :, None]  # [B, n, m]
        visible = (offset >= 0) & (offset <= self.positions[:, a:b, None])
        zero = torch.zeros((), dtype=self.dtype, device=device)
        mask = torch.where(visible, zero, zero - float("inf"))[:, None]  # [B, 1, n, m]
        if self.slopes is not None:  # ALiBi: -slope_h (i - j)
            mask = mask - self.slopes.to(self.dtype)[None, :, None, None] * (i[:, None] - j[None, :]).to(self.dtype)
        if self.kept is not None:
            self.kept[c] = mask
        return mask


class _CPUChunks(torch.autograd.Function):
    """The chunks on the CPU's fused attention, with one backward for all of them: each chunk's key and
    value gradients are added into one `[B, H, T, d]` buffer, where autograd through per-chunk slices
    of k and v would allocate and sum a full-size gradient per chunk (`T / C` passes over `k` and `v`
    for a layer). Saves q, k, v, the output and each chunk's log-sum-exp, as the fused call does."""

    @staticmethod
    def forward(ctx, qh, kh, vh, masks: ChunkMasks):
        outs, lses = [], []
        for c, (a, b, start) in enumerate(masks.spans):
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                qh[:, :, a:b], kh[:, :, start:b], vh[:, :, start:b], 0.0, False, attn_mask=masks(c))
            outs.append(out)
            lses.append(lse)
        out = torch.cat(outs, dim=2)
        ctx.masks = masks
        ctx.save_for_backward(qh, kh, vh, out, *lses)
        return out

    @staticmethod
    def backward(ctx, grad):
        qh, kh, vh, out, *lses = ctx.saved_tensors
        grad = grad.contiguous()
        dq, dk, dv = torch.empty_like(qh), torch.zeros_like(kh), torch.zeros_like(vh)
        for c, (a, b, start) in enumerate(ctx.masks.spans):
            gq, gk, gv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad[:, :, a:b], qh[:, :, a:b], kh[:, :, start:b], vh[:, :, start:b], out[:, :, a:b], lses[c],
                0.0, False, attn_mask=ctx.masks(c))
            dq[:, :, a:b] = gq
            dk[:, :, start:b] += gk
            dv[:, :, start:b] += gv
        return dq, dk, dv, None


# --- FlexAttention: every document of a batch in one fused call, on a GPU ---------------------------
#
# On CUDA the dense kinds read packed documents through torch's FlexAttention: one compiled kernel per
# layer and direction whatever the documents, skipping the key blocks outside each query block's
# documents (a `BlockMask` built once per batch from the document positions, on the device). On the CPU
# FlexAttention has no backward, and its forward compiles for every new shape, so training and reading
# there stay on the chunks above (`uses_flex`).


def uses_flex(q: torch.Tensor, impl: str) -> bool:
    """Whether a dense kind reads packed documents through FlexAttention: on CUDA, unless
    `model.attention.impl=reference` asks for the plain chunked form."""
    return q.is_cuda and impl != "reference"


def document_ids_of(positions: torch.Tensor) -> torch.Tensor:
    """`[B, T]`: which document of its row each token belongs to (a new one wherever a position is 0)."""
    return (positions == 0).long().cumsum(1)


def document_block_mask(positions: torch.Tensor, heads: int | None = None):
    """The FlexAttention `BlockMask` of rows with document positions `positions` `[B, T]`: query `i` reads
    key `j` of its own document at or before it. Built once per batch on the rows' device, shared by every
    layer (the mask does not depend on the head: `heads` None broadcasts it)."""
    from torch.nn.attention.flex_attention import create_block_mask

    documents = document_ids_of(positions)

    def same_document_causal(b, h, q_idx, kv_idx):
        return (documents[b, q_idx] == documents[b, kv_idx]) & (q_idx >= kv_idx)

    bsz, length = positions.shape
    return create_block_mask(same_document_causal, bsz, heads, length, length, device=positions.device)


_compiled_flex = None


def flex_document_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask,
                            slopes: torch.Tensor | None = None, compiled: bool = True) -> torch.Tensor:
    """`document_attention` through FlexAttention: q, k, v `[B, T, H, d]` (rotated where the kind
    rotates), `block_mask` from `document_block_mask`, `slopes` `[H]` ALiBi's `-slope_h (i - j)` (a score
    modification: inside a document `i - j` is the document's own distance). `compiled`: the fused kernel
    (`torch.compile`, as FlexAttention is meant to run); False runs its unfused reference (tests)."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx)

    if slopes is not None:
        slopes = slopes.to(q.dtype)
    score_mod = None if slopes is None else alibi

    if compiled and _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention)
    attend = _compiled_flex if compiled else flex_attention
    out = attend(*(x.transpose(1, 2) for x in (q, k, v)), score_mod=score_mod, block_mask=block_mask)
    return out.transpose(1, 2)
