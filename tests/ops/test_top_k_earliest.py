"""`top_k_earliest` (fsframework/ops/freesolo_routing.py): the top-K of Eq. 7's scores with ties won by the
earlier cell, exactly, by either of its two ways (one stable sort for a small call, `topk` plus a tie pass
for a large one), checked against a plain Python ranking."""

from __future__ import annotations

import pytest
import torch

import fsframework.ops.freesolo_routing as routing
from fsframework.ops.freesolo_routing import top_k_earliest
from tests.work import WorkCounter


def _ranked(scores: torch.Tensor, valid: torch.Tensor | None, top_k: int) -> torch.Tensor:
    """The definition, one row at a time: valid positions by (score descending, position ascending)."""
    if valid is not None:
        valid = valid.expand_as(scores)
    rows = scores.reshape(-1, scores.shape[-1]).tolist()
    masks = [None] * len(rows) if valid is None else valid.reshape(-1, scores.shape[-1]).tolist()
    out = []
    for row, mask in zip(rows, masks):
        keep = [j for j in range(len(row)) if mask is None or mask[j]]
        best = sorted(keep, key=lambda j: (-row[j], j))[:top_k]
        out.append(best + [-1] * (top_k - len(best)))
    return torch.tensor(out, dtype=torch.long).view(*scores.shape[:-1], top_k)


def _cases(seed: int):
    """Rounded scores (many ties; from ~40 entries on an unstable sort breaks them out of order), -inf and
    -0.0 among them, with and without a validity mask, K above and below M."""
    gen = torch.Generator().manual_seed(seed)
    for trial in range(60):
        cells = int(torch.randint(1, 11 if trial % 3 else 49, (), generator=gen))  # an unstable sort reorders ties
        shape = (2, int(torch.randint(1, 4, (), generator=gen)), 3, cells)
        scores = torch.randn(shape, generator=gen).round()
        scores[torch.rand(shape, generator=gen) < 0.15] = float("-inf")
        scores[torch.rand(shape, generator=gen) < 0.15] = -0.0
        valid = torch.rand((2, 1, 3, shape[-1]), generator=gen) > 0.3 if trial % 2 else None
        yield scores, valid, int(torch.randint(1, 6, (), generator=gen))


@pytest.mark.parametrize("way", ["sort", "topk"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_both_ways_give_the_ranking_of_the_definition(way, dtype, monkeypatch):
    monkeypatch.setattr(routing, "_SORT_MAX_SCORES", 1 << 30 if way == "sort" else 0)
    for scores, valid, top_k in _cases(seed=3):
        got = top_k_earliest(scores.to(dtype), valid, top_k)
        assert torch.equal(got, _ranked(scores, valid, top_k)), (scores, valid, top_k, got)


@pytest.mark.parametrize("cells,way", [(72, "sort"), (4096, "topk")])
def test_a_decoded_tokens_candidates_take_one_sort(cells, way):
    """A decoded token's few candidates (FS-L: P + W per head) are ranked by one stable sort, a whole
    block's many scores by `topk` (which the sort would cost more than at that size, docs/decoding.md)."""
    scores, valid = torch.randn(1, 1, 4, cells), torch.ones(1, 1, 4, cells, dtype=torch.bool)
    with WorkCounter() as work:
        top_k_earliest(scores, valid, 4)
    assert ("topk" in work.ops) == (way == "topk"), work.ops
    if way == "sort":
        assert work.ops["sort"] == 1 and work.dispatched <= 10, work.ops
