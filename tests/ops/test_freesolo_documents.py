"""FreeSolo's long-range branch over packed documents in one call (fsframework.ops.freesolo_documents):
the long documents laid out from block boundaries, routed with `first_cells`, read out once, equal
to every document read as a row of its own."""

from __future__ import annotations

import pytest
import torch

from fsframework.models.freesolo_settings import fs_pair
from fsframework.ops.freesolo import cell_readout, select_cells
from fsframework.ops.freesolo_documents import DocumentBlocks, packed_long_range
from fsframework.ops.freesolo_readout import chunk_queries
from tests.utils import positions_of

S, BLK, H, D = 4, 8, 2, 6
SIZES = [[37, 8, 50, 1], [17, 3, 76]]  # lengths not multiples of the cell or block, some within one block
FIELDS = dict(cell_size=S, block_size=BLK, window=16, top_k=2, recent_cells=2, retained_cells=3,
              impl="reference", sigma=torch.tensor([6.0, 20.0], dtype=torch.float64),
              lam=torch.tensor([1.0, 3.0], dtype=torch.float64))


def test_the_layout_puts_each_long_document_at_a_block_boundary():
    blocks = DocumentBlocks.of(positions_of(SIZES), BLK, S, "cpu")
    total = sum(map(sum, SIZES))
    # long documents (more than a block) in packed order (flat row * 96 + t) and where they are laid:
    # 37 @ 0 -> 0, 50 @ 45 -> 40, 17 @ 96 -> 96, 76 @ 116 -> 120
    firsts, laid = [0, 45, 96, 116], [0, 40, 96, 120]
    lengths = [37, 50, 17, 76]
    assert blocks.length == 120 + 80
    for first, at, length in zip(firsts, laid, lengths):
        assert blocks.gather[at:at + length].tolist() == list(range(first, first + length))
        assert blocks.back[first:first + length].tolist() == list(range(at, at + length))
        padded = -(-length // BLK) * BLK
        assert (blocks.gather[at + length:at + padded] == total).all()  # padding reads the zero row
        assert blocks.first_cells[at // BLK:(at + padded) // BLK].tolist() == [at // S] * (padded // BLK)
    short = [i for i in range(total) if not any(f <= i < f + n for f, n in zip(firsts, lengths))]
    assert (blocks.back[short] == blocks.length).all()  # short documents read nothing long range


def test_no_long_document_gives_zeros():
    blocks = DocumentBlocks.of(positions_of([[8, 3], [5, 6]]), BLK, S, "cpu")
    q = torch.randn(2, 11, H, D, dtype=torch.float64)
    cfg, prior = fs_pair(**FIELDS)
    gain = torch.ones(H, D, dtype=torch.float64, requires_grad=True)
    out = packed_long_range(q, q, q, blocks, cfg, prior, gain)
    assert blocks.length == 0 and torch.equal(out, torch.zeros_like(q))
    out.sum().backward()
    assert torch.equal(gain.grad, torch.zeros_like(gain))


def _alone(q, k, v, sizes, cfg, prior, gain):
    """Each document's long-range branch as a row of its own (the op `freesolo` runs on a row)."""
    out = torch.zeros_like(q)
    for b, row in enumerate(sizes):
        s = 0
        for n in row:
            qq, kk, vv = (x[b:b + 1, s:s + n] for x in (q, k, v))
            cells = select_cells(qq, kk, cfg, prior)
            out[b:b + 1, s:s + n] = cell_readout(qq, kk, vv, cells, cfg, rms_weight=gain)
            s += n
    return out


@pytest.mark.parametrize("variant", ["fs", "fsl"])
def test_equals_each_document_alone(variant):
    cfg, prior = fs_pair(**FIELDS, variant=variant)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 96, H, D, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    gain = (1 + 0.1 * torch.randn(H, D, dtype=torch.float64, generator=gen)).requires_grad_()
    blocks = DocumentBlocks.of(positions_of(SIZES), BLK, S, "cpu")
    got = packed_long_range(q, k, v, blocks, cfg, prior, gain)
    want = _alone(q, k, v, SIZES, cfg, prior, gain)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    probe = torch.randn(got.shape, dtype=torch.float64, generator=gen)
    for g, w in zip(torch.autograd.grad((got * probe).sum(), [q, k, v, gain]),
                    torch.autograd.grad((want * probe).sum(), [q, k, v, gain])):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


def test_readout_chunks_span_no_more_than_a_packed_row(monkeypatch):
    """The laid-out row is read in chunks no longer than a packed row (a chunk's union of cells then
    spans as few documents as a packed row's chunk): seen by the chunk size the readout is handed."""
    from fsframework.ops import freesolo_readout

    seen = []
    real = freesolo_readout._chunks
    monkeypatch.setattr(freesolo_readout, "_chunks",
                        lambda cells, num_cells, cell_size, dim, chunk=None: seen.append(chunk) or
                        real(cells, num_cells, cell_size, dim, chunk))
    cfg, prior = fs_pair(**FIELDS)
    q = torch.randn(2, 96, H, D, dtype=torch.float64)
    packed_long_range(q, q, q, DocumentBlocks.of(positions_of(SIZES), BLK, S, "cpu"), cfg, prior, None)
    assert seen == [min(96, chunk_queries(2, H, cfg.top_k, S, D))]


def _laid_out(per_document, lengths):
    """Per-document `[Bt, L, H, d]` tensors laid end to end from block boundaries, and the first cells."""
    padded = [-(-n // BLK) * BLK for n in lengths]
    out = per_document[0].new_zeros((per_document[0].shape[0], sum(padded), *per_document[0].shape[2:]))
    firsts, at = [], 0
    for x, n, p in zip(per_document, lengths, padded):
        out[:, at:at + n] = x
        firsts += [at // S] * (p // BLK)
        at += p
    return out, torch.tensor(firsts)


@pytest.mark.parametrize("variant", ["fs", "fsl"])
def test_routing_by_first_cells_is_each_document_routed_alone(variant):
    """The reference routing (the kernels' oracle): a block scores only its document's cells, FS-L's
    retained and recent sets restart at each document; cell ids are the laid-out row's."""
    cfg, prior = fs_pair(**FIELDS, variant=variant)
    lengths = [37, 8, 50, 17, 3]
    gen = torch.Generator().manual_seed(1)
    qs = [torch.randn(2, n, H, D, dtype=torch.float64, generator=gen) for n in lengths]
    ks = [torch.randn(2, n, H, D, dtype=torch.float64, generator=gen) for n in lengths]
    q, firsts = _laid_out(qs, lengths)
    k, _ = _laid_out(ks, lengths)
    got = select_cells(q, k, cfg, prior, first_cells=firsts)
    at = 0
    for qq, kk, n in zip(qs, ks, lengths):
        alone = select_cells(qq, kk, cfg, prior)
        assert torch.equal(got[:, at:at + n], torch.where(alone >= 0, alone + at // S, -1))
        at += -(-n // BLK) * BLK


def test_bad_first_cells_are_refused():
    cfg, prior = fs_pair(**FIELDS)
    q = torch.zeros(1, 24, H, D)
    with pytest.raises(ValueError, match=r"CPU tensor \[3\]"):
        select_cells(q, q, cfg, prior, first_cells=torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="block-aligned"):
        select_cells(q, q, cfg, prior, first_cells=torch.tensor([0, 1, 1]))  # not a block's first cell
    with pytest.raises(ValueError, match="block-aligned"):
        select_cells(q, q, cfg, prior, first_cells=torch.tensor([0, 4, 2]))  # decreasing
    with pytest.raises(ValueError, match="FS-B"):
        select_cells(q, q, *fs_pair(**FIELDS, variant="fsb"), first_cells=torch.tensor([0, 0, 0]))
