"""Runway-rewired attention over packed documents (fsframework.ops.rewired, `positions`): one call equals
each document run alone as a row of its own, forward and gradients, both runways and scores; the tile
walk reads only its documents' keys; bad positions are named."""

from __future__ import annotations

import pytest
import torch

from fsframework.ops.rewired import RewiredSettings, rewired_attention, rewired_attention_rows, rewired_rows
from tests.ops.test_rewired import _inputs
from tests.utils import positions_of
from tests.work import WorkCounter

# two rows of 60 tokens with different documents, each with a 1-token and a 2-token one, documents
# across and inside the 16-query tiles of `test_query_tiles_read_their_documents_keys`
ROWS = [[1, 2, 17, 40], [25, 1, 2, 32]]


def each_document_alone(q, k, v, u, rows, **kwargs) -> torch.Tensor:
    """The documents cut out of the rows, each run as a row of its own (positions=None), put back."""
    out = []
    for b, row in enumerate(rows):
        starts = [sum(row[:i]) for i in range(len(row))]
        out.append(torch.cat([rewired_attention(*(x[b:b + 1, a:a + length] for x in (q, k, v, u)), **kwargs)
                              for a, length in zip(starts, row)], dim=1))
    return torch.cat(out)


@pytest.mark.parametrize("runway", ["last", "mean"])
@pytest.mark.parametrize("bilinear", [False, True], ids=["dot", "bilinear"])
def test_packed_call_equals_each_document_alone(runway, bilinear):
    q, k, v, u, bmat = _inputs(2, 60, 2, 8, bilinear)
    leaves = [x for x in (q, k, v, u, bmat) if x is not None]
    kwargs = dict(settings=RewiredSettings(runway=runway), bmat=bmat, impl="reference")
    got = rewired_attention(q, k, v, u, positions=positions_of(ROWS), **kwargs)
    want = each_document_alone(q, k, v, u, ROWS, **kwargs)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(want)
    g_got = torch.autograd.grad(got, leaves, grad)
    g_want = torch.autograd.grad(want, leaves, grad)
    for name, a, b in zip("q k v u bmat".split(), g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=lambda m: f"d{name}: {m}")
    assert g_got[3].abs().sum() > 0  # the bias really reaches u


@pytest.mark.parametrize("runway", ["last", "mean"])
def test_one_document_a_row_is_the_plain_call(runway):
    """positions counting 0..T-1 (each row one document) give today's call bit for bit."""
    q, k, v, u, bmat = _inputs(2, 50, 2, 8, True, seed=2)
    kwargs = dict(settings=RewiredSettings(runway=runway), bmat=bmat, impl="reference")
    with torch.no_grad():
        plain = rewired_attention(q, k, v, u, **kwargs)
        packed = rewired_attention(q, k, v, u, positions=positions_of([[50], [50]]), **kwargs)
    assert torch.equal(packed, plain)


def test_a_document_start_cuts_the_runway_and_the_keys():
    """A document's first token reads itself only, its second the two exempt keys (plain attention),
    whatever the document before holds."""
    q, k, v, u, _ = _inputs(1, 12, 2, 4, False, seed=4)
    pos = positions_of([[10, 2]])
    with torch.no_grad():
        out = rewired_attention(q, k, v, u * 50, positions=pos, impl="reference")
        torch.testing.assert_close(out[:, 10], v[:, 10], rtol=0, atol=0)
        att = torch.softmax(torch.einsum("hd,mhd->hm", q[0, 11], k[0, 10:12]) / 2.0, dim=-1)
        torch.testing.assert_close(out[0, 11], torch.einsum("hm,mhd->hd", att, v[0, 10:12]))


@pytest.mark.parametrize("runway", ["last", "mean"])
def test_query_tiles_read_their_documents_keys(runway):
    """16-query tiles (documents across and inside them) give the 128-query tile's result, and a tile
    starts its keys at its queries' earliest document start."""
    q, k, v, u, bmat = _inputs(2, 60, 2, 8, True, seed=1)
    pos = positions_of(ROWS)
    largest = {}
    with torch.no_grad():
        r = rewired_rows(u, runway, bmat, 0, 60, pos)
        whole = rewired_attention_rows(q, k, v, r, u, positions=pos)
        with WorkCounter() as work:
            tiled = rewired_attention_rows(q, k, v, r, u, tile=16, positions=pos)
        largest["documents"] = work.largest
        with WorkCounter() as work:
            rewired_attention_rows(q, k, v, r, u, tile=16)
        largest["rows"] = work.largest
    torch.testing.assert_close(tiled, whole, rtol=1e-12, atol=1e-12)
    # the logits [B, H, 16, keys] of the widest tile: queries [16, 32) over [0, 32) (the documents of
    # [32, 48) start at 20 and 28, of [48, 60) at 20 and 28); read whole, [32, 48) over [0, 48)
    assert largest == dict(documents=2 * 2 * 16 * 32, rows=2 * 2 * 16 * 48)


def test_work_follows_the_documents_not_the_row():
    """N = 600 in 40-token documents: each 128-query tile reads at most 128 + 39 keys, forward and
    backward, where the whole row's last tile reads 600."""
    n = 600
    q, k, v, u, bmat = _inputs(1, n, 1, 4, True)
    kwargs = dict(settings=RewiredSettings(runway="mean"), bmat=bmat, impl="reference")
    with WorkCounter() as work:
        out = rewired_attention(q, k, v, u, positions=positions_of([[40] * 15]), **kwargs)
        torch.autograd.grad(out.sum(), (q, k, v, u, bmat))
    assert work.largest <= 128 * (128 + 39)
    with torch.no_grad():
        torch.testing.assert_close(out, each_document_alone(q, k, v, u, [[40] * 15], **kwargs), rtol=1e-12,
                                   atol=1e-12)


@pytest.mark.parametrize("change, match", [
    (dict(q_start=10), "take whole rows: q_start must be 0"),
    (dict(positions=positions_of([[20]]).float()), "positions must be an integer tensor"),
    (dict(positions=positions_of([[10]])), r"positions must be \[B, T\]"),
    (dict(positions=positions_of([[20]]) + 1), "a row's first token starts a document"),
    (dict(positions=torch.cat((torch.arange(5), torch.arange(6, 21)))[None]), r"positions\[0, 5\] = 6"),
], ids=["q_start", "dtype", "shape", "first-token", "jump"])
def test_bad_positions_name_the_problem(change, match):
    q, k, v, u, _ = _inputs(1, 20, 2, 8, False)
    q_start = change.get("q_start", 0)
    with pytest.raises(ValueError, match=match):
        rewired_attention(q[:, q_start:], k, v, u, impl="reference", q_start=q_start,
                          positions=change.get("positions", positions_of([[20]])))
