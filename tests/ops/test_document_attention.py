"""Causal attention over packed documents in one call per query chunk
(fsframework.ops.document_attention): each document read as a row of its own, in a number of calls
that does not grow with the documents."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fsframework.ops import document_attention as doc_attn
from fsframework.ops.document_attention import ChunkMasks, chunk_key_starts, chunk_size, document_attention
from tests.utils import positions_of
from tests.work import WorkCounter

H, D = 2, 8
SIZES = [[50, 3, 1, 100, 46], [200]]  # a 1-token document, boundaries inside chunks, one row one document
SLOPES = torch.tensor([0.5, 0.125], dtype=torch.float64)


def _alone(q, k, v, sizes, slopes):
    """Each document through plain SDPA with its own causal (and ALiBi) mask, as a row of its own."""
    out = torch.zeros_like(q)
    for b, row in enumerate(sizes):
        s = 0
        for n in row:
            qq, kk, vv = (x[b:b + 1, s:s + n].transpose(1, 2) for x in (q, k, v))
            i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
            bias = torch.zeros(n, n, dtype=q.dtype).masked_fill(j > i, float("-inf"))
            if slopes is not None:
                bias = bias[None] - slopes[:, None, None] * (i - j)
            out[b:b + 1, s:s + n] = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=bias).transpose(1, 2)
            s += n
    return out


@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("grad", [True, False])
def test_equals_each_document_alone(alibi, grad):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 200, H, D, dtype=torch.float64, generator=gen, requires_grad=grad) for _ in range(3))
    slopes = SLOPES if alibi else None
    positions = positions_of(SIZES)
    with torch.set_grad_enabled(grad):
        got = document_attention(q, k, v, positions, slopes=slopes)
        want = _alone(q, k, v, SIZES, slopes)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    if grad:
        probe = torch.randn(got.shape, dtype=torch.float64, generator=gen)
        for g, w in zip(torch.autograd.grad((got * probe).sum(), [q, k, v]),
                        torch.autograd.grad((want * probe).sum(), [q, k, v])):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


def test_masks_rebuilt_per_call_past_the_budget(monkeypatch):
    """Masks too large to keep for the batch are built by each call: the same numbers."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 200, H, D, dtype=torch.float64, generator=gen) for _ in range(3))
    positions = positions_of(SIZES)
    kept = ChunkMasks(positions, chunk_key_starts(positions), SLOPES, torch.float64)
    monkeypatch.setattr(doc_attn, "KEPT_MASK_ELEMENTS", 0)
    rebuilt = ChunkMasks(positions, chunk_key_starts(positions), SLOPES, torch.float64)
    assert kept.kept is not None and rebuilt.kept is None
    torch.testing.assert_close(document_attention(q, k, v, positions, masks=rebuilt),
                               document_attention(q, k, v, positions, masks=kept), rtol=0, atol=0)


def _attention_work(sizes, length):
    q, k, v = (torch.randn(len(sizes), length, H, D, requires_grad=True) for _ in range(3))
    with WorkCounter() as work:
        document_attention(q, k, v, positions_of(sizes)).sum().backward()
    calls = sum(n for op, n in work.ops.items() if op.startswith("_scaled_dot_product"))
    return calls, work.macs


def test_calls_do_not_grow_with_documents_and_work_stays_causal():
    """The work guard: the same number of fused calls for 1 and for 64 documents (one per query
    chunk and direction); one document costs at most its causal square and C / T more, many short
    ones far less."""
    length = 1024
    one = [[length]]
    many = [[16] * 64]
    calls_one, macs_one = _attention_work(one, length)
    calls_many, macs_many = _attention_work(many, length)
    assert calls_one == calls_many == 2 * (length // chunk_size(length))
    # tests.work's count of a fused causal call, forward (2 d a pair) and backward (5/2 of it)
    causal = 3.5 * 2 * H * D * length * length / 2
    assert macs_one <= causal * (1 + chunk_size(length) / length) * 1.01
    assert macs_many < macs_one / 4


def test_bad_shapes_are_refused():
    q = torch.zeros(2, 10, H, D)
    with pytest.raises(ValueError, match="must share B, T"):
        document_attention(q, q, q, torch.zeros(2, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="one start per chunk"):
        ChunkMasks(torch.zeros(2, 10, dtype=torch.long), [0, 0], None, torch.float32)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("alibi", [False, True])
def test_flex_attention_with_the_document_block_mask_equals_each_document_alone(alibi):
    """The GPU path (`flex_document_attention`) in FlexAttention's unfused form, which runs on the CPU
    without gradients: the same numbers as each document alone, and its block mask skips the key blocks
    of other documents (work that does not grow with the row for short documents)."""
    from fsframework.ops.document_attention import document_block_mask, flex_document_attention

    gen = torch.Generator().manual_seed(2)
    sizes = [[120, 8, 3, 1, 100, 24], [256]]  # row 0: no document crosses position 128
    q, k, v = (torch.randn(2, 256, H, D, dtype=torch.float64, generator=gen) for _ in range(3))
    slopes = SLOPES if alibi else None
    positions = positions_of(sizes)
    mask = document_block_mask(positions)
    with torch.no_grad():
        got = flex_document_attention(q, k, v, mask, slopes, compiled=False)
    torch.testing.assert_close(got, _alone(q, k, v, sizes, slopes), rtol=0, atol=1e-12)
    # blocks of 128: row 0's second query block reads its own key block only, row 1's the causal two
    blocks = mask.kv_num_blocks[:, 0] + (mask.full_kv_num_blocks[:, 0] if mask.full_kv_num_blocks is not None else 0)
    assert blocks.tolist() == [[1, 1], [1, 2]]
