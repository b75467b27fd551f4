"""A decoded token costs what docs/decoding.md says, counted in multiply-adds (tests/work.py), not timed:
`O(context)` for the kinds that read the whole prefix, a bound that does not depend on the context for
SWA, FS-L and AR-GRC. One decode step (and one prefill chunk) after a prompt of `T` tokens is compared
with the same after `4T`: linear work grows 4x, a padded `T x T` attention call 16x. Elements written
(tests/work.py) catch what multiply-adds miss: a bounded kind's token writes the same at any context,
and FS-B's, whose search deepens by `log C`, no pass over its cells."""

from __future__ import annotations

import pytest
import torch

from fsframework.models.decode_cache import decode_cache, prefill
from tests.utils import tiny_model
from tests.work import WorkCounter

VOCAB, CONTEXT, CHUNK = 64, 256, 32
# every token reads every key (FS: every cell; FS-B: its cache grows linearly, its search logarithmically)
PREFIX = ["tfpp", "alibi", "sinusoidal", "rewired", "fs", "fsb"]
BOUNDED = ["swa", "fsl", "argrc"]  # a window, a bounded cell set, the scan's roots


def _work(model, context: int) -> tuple[int, int]:
    """Multiply-adds of one decoded token after `context` prompt tokens, then of a prefill chunk."""
    tokens = torch.randint(0, VOCAB, (1, context + 1 + CHUNK), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), decode_cache(model) as cache:
        cache.forward(tokens[:, :context])
        with WorkCounter() as step:
            cache.forward(tokens[:, context:context + 1])
        with WorkCounter() as chunk:
            cache.forward(tokens[:, context + 1:])
    return step.macs, chunk.macs


@pytest.mark.parametrize("name", PREFIX + BOUNDED)
def test_decode_step_and_prefill_chunk_work(name):
    model = tiny_model(name, VOCAB)
    (step, chunk), (step4, chunk4) = _work(model, CONTEXT), _work(model, 4 * CONTEXT)
    assert step > 0 and chunk > 0  # counted (tests/work.py)
    bound = 4.5 if name in PREFIX else 1.2
    assert step4 <= bound * step, (step, step4)
    assert chunk4 <= bound * chunk, (chunk, chunk4)


@pytest.mark.parametrize("name", ["swa", "fsl"])
def test_a_decoded_token_rotates_only_its_own_query_and_key(name, monkeypatch):
    """The window's keys are kept rotated (docs/decoding.md): a step rotates 1 query and 1 key per
    layer, not the whole window again."""
    import fsframework.models.attention
    import fsframework.ops.freesolo_decode
    import fsframework.ops.local_attention
    import fsframework.ops.offset_attention
    from fsframework.ops.rope import rotate

    rows = []

    def counting(x, *args, **kwargs):
        rows.append(x.shape[1])
        return rotate(x, *args, **kwargs)

    for module in (fsframework.models.attention, fsframework.ops.freesolo_decode, fsframework.ops.local_attention,
                   fsframework.ops.offset_attention):
        monkeypatch.setattr(module, "rotate", counting)
    model = tiny_model(name, VOCAB)
    tokens = torch.randint(0, VOCAB, (1, 101), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), decode_cache(model) as cache:
        cache.forward(tokens[:, :100])
        rows.clear()
        cache.forward(tokens[:, 100:])
    assert sum(rows) == 2 * len(model.layers), rows


@pytest.mark.parametrize("name", PREFIX + BOUNDED)
def test_prefill_in_chunks_costs_no_more_than_a_forward(name):
    """A prompt prefilled in chunks through the cache does no more multiply-adds than one forward
    pass over it (docs/decoding.md): chunking bounds memory without adding work."""
    model = tiny_model(name, VOCAB)
    tokens = torch.randint(0, VOCAB, (1, CONTEXT), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        with WorkCounter() as forward:
            model(tokens)
        with decode_cache(model, chunk=CHUNK * 2) as cache, WorkCounter() as chunked:  # 4 chunks
            prefill(cache, tokens)
    assert 0 < chunked.macs <= 1.02 * forward.macs, (forward.macs, chunked.macs)


@pytest.mark.parametrize("name", ["fs", "fsl"])
def test_a_query_block_prepares_its_candidates_once(name, monkeypatch):
    """What Eq. 7 reads of a block's candidates (prior weights, centers, FS-L's valid mask) changes only at
    a block boundary (docs/decoding.md): the cache prepares it at the block's first token and its other
    tokens reuse it."""
    import fsframework.ops.freesolo_decode as caches

    prepared, prepare = [], caches.block_candidates

    def counting(*args, **kwargs):
        prepared.append(1)
        return prepare(*args, **kwargs)

    monkeypatch.setattr(caches, "block_candidates", counting)
    model = tiny_model(name, VOCAB)  # blocks of 8
    tokens = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), decode_cache(model) as cache:
        cache.forward(tokens[:, :16])  # blocks 0 and 1 (block 0 reads no cell)
        prepared.clear()
        for pos in range(16, 40):  # three blocks of 8 tokens, one token at a time
            cache.forward(tokens[:, pos:pos + 1])
    assert len(prepared) == 3 * len(model.layers), len(prepared)


def test_fsb_walks_the_upper_levels_of_its_forests_once_per_block(monkeypatch):
    """The levels of FS-B's search where every child fits are the same for every query; the forests
    change only at a block boundary, so a decoded block's tokens walk them once (docs/decoding.md)."""
    import fsframework.ops.fsb_search as search

    walked, walk = [], search.shared_walk

    def counting(*args, **kwargs):
        walked.append(1)
        return walk(*args, **kwargs)

    monkeypatch.setattr(search, "shared_walk", counting)
    model = tiny_model("fsb", VOCAB)  # blocks of 8
    tokens = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), decode_cache(model) as cache:
        cache.forward(tokens[:, :16])
        walked.clear()
        for pos in range(16, 40):  # three blocks of 8 tokens, one token at a time
            cache.forward(tokens[:, pos:pos + 1])
    assert len(walked) == 3 * len(model.layers), len(walked)


def _token(model, context: int) -> WorkCounter:
    """The counts of one decoded token inside a block (no boundary work) after `context + 1` tokens."""
    tokens = torch.randint(0, VOCAB, (1, context + 2), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), decode_cache(model) as cache:
        cache.forward(tokens[:, :context + 1])
        with WorkCounter() as counted:
            cache.forward(tokens[:, context + 1:])
    return counted


def _ops_per_token(model, context: int) -> int:
    return _token(model, context).dispatched  # aten ops dispatched: a token's host work, machine-independent


@pytest.mark.parametrize("name", ["swa", "fsl", "fs", "tfpp", "alibi", "sinusoidal", "rewired"])
def test_a_decoded_token_dispatches_no_more_ops_at_a_longer_context(name):
    """A token's ops have shapes that grow with the context (FS, the prefix kinds) or not (SWA, FS-L), but
    their number does not: a per-token loop over cells, blocks or chunks of keys would show here, as a
    padded `T x T` call shows in multiply-adds (FS-B's beam walks trees of depth log C: excluded)."""
    model = tiny_model(name, VOCAB)
    short, long = _ops_per_token(model, 64), _ops_per_token(model, 256)
    assert 0 < long <= short, (short, long)


def test_a_freesolo_token_dispatches_at_most_1_8_times_a_window_tokens_ops():
    """FS and FS-L add routing and a readout to SWA's layer, per block constants prepared once and the
    readout one fused call (docs/decoding.md): 362 and 340 ops against SWA's 212 for the tiny model
    (408 and 386 with the chunk path's readout, 516 and 484 when every token rebuilt the constants)."""
    swa = _ops_per_token(tiny_model("swa", VOCAB), 64)
    for name in ("fsl", "fs"):
        assert _ops_per_token(tiny_model(name, VOCAB), 64) <= 1.8 * swa, name


@pytest.mark.parametrize("name", BOUNDED)
def test_a_bounded_decoded_token_writes_the_same_elements_at_any_context(name):
    """Elements written (tests/work.py) count the elementwise and indexing work multiply-adds miss: a
    mask, a sort or a copy over every cell or position of the context would show here."""
    model = tiny_model(name, VOCAB)
    short, long = _token(model, 64).written, _token(model, 256).written
    assert 0 < long <= short, (short, long)


def test_an_fsb_decoded_token_does_no_pass_over_the_cells():
    """FS-B's token searches forests of depth log C and rescores a bounded union (docs/decoding.md): 4x
    the context adds a constant, a few more levels, whatever the context; a pass over the C cells
    (a presence mask, every cell's center, a copy of the priorities) adds 4x more each time."""
    model = tiny_model("fsb", VOCAB)
    short, mid, long = (_token(model, context).written for context in (256, 1024, 4096))
    assert short < mid < long, (short, mid, long)  # counted, and the search deepens
    assert long - mid <= 1.1 * (mid - short), (short, mid, long)
