"""The key/value cache decodes exactly what full forward passes decode, for every model kind."""

from __future__ import annotations

import pytest
import torch

from fsframework.config import AttentionConfig, ModelConfig
from fsframework.eval.decoding import greedy_generate
from fsframework.models.decode_cache import decode_cache, supports_decode_cache
from fsframework.models.freesolo_attention import set_fsb_thresholds
from fsframework.models.registry import MODEL_NAMES, build_model

KINDS = list(MODEL_NAMES)  # every registry kind
VOCAB = 260


def _distinct_tokens(batch: int, length: int) -> torch.Tensor:
    """Tokens without repeats within a row. First-layer keys of the NoPE long-range branch
    depend on the token alone, so a repeated token makes two cells tie EXACTLY on their
    max key norm (FS-L pruning); an exact tie is then broken by last-bit differences between
    projecting one token and projecting the whole sequence, which is not a cache error."""
    return torch.stack([torch.randperm(VOCAB)[:length] for _ in range(batch)])


def _model(name: str, **attention) -> torch.nn.Module:
    # small cells, blocks and window so that 90 positions cross many block and window boundaries;
    # FS-L keeps fewer cells than the prefix holds, so its pruning is exercised
    att = AttentionConfig(window=12, cell_size=4, block_size=8, top_k=2, sigma=2.0, recent_cells=2,
                          retained_cells=3, impl="reference", **attention)
    torch.manual_seed(0)
    model = build_model(ModelConfig(name=name, vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=2, attention=att))
    if name == "fsb":  # FS-B reads with per-head thresholds that a checkpoint's calibration supplies
        set_fsb_thresholds(model, [[0.3, 0.5], [0.4, 0.2]], "test thresholds")
    return model.double().eval()


@pytest.mark.parametrize("name", KINDS)
def test_cached_logits_equal_full_forward_at_every_position(name):
    model = _model(name)
    tokens = _distinct_tokens(2, 90)
    with torch.no_grad():
        full = model(tokens)
        with decode_cache(model, chunk=16) as cache:
            # a prefill that ends mid-block (run in chunks of 16, which FreeSolo's caches walk block
            # by block), then single tokens, then a chunk of 5 that crosses a block boundary
            pieces = [cache.forward(tokens[:, :37])]
            pieces += [cache.forward(tokens[:, t:t + 1]) for t in range(37, 85)]
            pieces.append(cache.forward(tokens[:, 85:]))
        cached = model.lm_head(torch.cat(pieces, dim=1))
    assert cache.length == 90
    torch.testing.assert_close(cached, full, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("combine", ["gate", "separate_wo"])
def test_cached_freesolo_combine_modes(combine):
    model = _model("fs", combine=combine)
    tokens = _distinct_tokens(1, 40)
    with torch.no_grad():
        full = model(tokens)
        with decode_cache(model) as cache:
            cached = torch.cat([cache.forward(tokens[:, :19])] + [cache.forward(tokens[:, t:t + 1])
                                                                   for t in range(19, 40)], dim=1)
    torch.testing.assert_close(model.lm_head(cached), full, rtol=1e-9, atol=1e-9)


def _cache_bytes_at(name: str, lengths: list[int]) -> list[int]:
    """The cache's allocated bytes after decoding to each of `lengths` (prefill of the first)."""
    model = _model(name)
    sizes = []
    with torch.no_grad(), decode_cache(model, chunk=16) as cache:
        cache.forward(torch.randint(0, VOCAB, (1, lengths[0])))
        sizes.append(cache.nbytes)
        for length in lengths[1:]:
            while cache.length < length:
                cache.forward(torch.randint(0, VOCAB, (1, 1)))
            sizes.append(cache.nbytes)
    return sizes


@pytest.mark.parametrize("name", ["swa", "fsl"])
def test_bounded_caches_do_not_grow_with_the_context(name):
    # SWA: a ring of `window` positions; FS-L: window + unfinished block + (retained + recent) cells,
    # full once more cells than P + W are eligible (3 + 2 cells of 4 tokens: from position 24)
    sizes = _cache_bytes_at(name, [40, 97, 161, 250])
    assert sizes[0] > 0 and len(set(sizes)) == 1, sizes
    model = _model(name)
    a, layers, heads, dim = model.cfg.attention, model.cfg.n_layers, model.cfg.n_heads, model.cfg.head_dim
    kv = 2 * heads * dim * 8  # one position's key and value, fp64
    if name == "swa":
        assert sizes[0] == layers * a.window * kv
    else:
        cells = a.retained_cells + a.recent_cells
        raw = (a.window + a.block_size) * kv + cells * a.cell_size * kv  # ring, pending block, candidate cells
        summaries = heads * cells * (8 + dim * 8 + 8)  # cell index (int64), mean key, key norm
        assert sizes[0] == layers * (raw + summaries)


@pytest.mark.parametrize("name", ["tfpp", "fs"])
def test_prefix_caches_grow_geometrically(name):
    # capacity doubles: appending one token at a time reallocates O(log T) times, not T times
    model = _model(name)
    with torch.no_grad(), decode_cache(model) as cache:
        cache.forward(torch.randint(0, VOCAB, (1, 5)))
        buffers = set()
        for _ in range(200):
            cache.forward(torch.randint(0, VOCAB, (1, 1)))
            kv = cache.layers[0].kv if name == "tfpp" else cache.layers[0].archive
            buffers.add(kv.tensors[0].data_ptr())
        capacity = kv.capacity
    assert len(buffers) <= 3 and 205 <= capacity < 2 * 205


@pytest.mark.parametrize("name", ["tfpp", "swa", "fs"])
def test_greedy_generation_with_and_without_cache_agree(name):
    # FS-L is left to the logits test above: generated tokens repeat, and its pruning can tie (see
    # `_distinct_tokens`)
    model = _model(name).float()
    prompts = [_distinct_tokens(1, 29)[0].tolist() for _ in range(3)] + [_distinct_tokens(1, 17)[0].tolist()]
    cached = greedy_generate(model, prompts, 12, batch_size=2)
    plain = greedy_generate(model, prompts, 12, batch_size=2, use_cache=False)
    assert cached == plain
    assert all(len(row) == 12 for row in cached)


def test_decoding_leaves_the_model_untouched():
    model = _model("fs")
    before = [type(layer.attn) for layer in model.layers]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(RuntimeError, match="boom"), decode_cache(model) as cache:
        cache.forward(_distinct_tokens(1, 9))
        raise RuntimeError("boom")
    assert [type(layer.attn) for layer in model.layers] == before
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_models_without_a_cached_form_are_refused():
    assert not supports_decode_cache(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="no cached decoding form"), decode_cache(torch.nn.Linear(2, 2)):
        pass
    with pytest.raises(ValueError, match=r"\[B, n\]"), decode_cache(_model("tfpp")) as cache:
        cache.forward(torch.zeros(2, 0, dtype=torch.long))


@pytest.mark.parametrize("name", ["fsl", "tfpp"])
def test_generation_prefills_each_prompt_once_in_chunks(name, monkeypatch):
    # what `fsf eval` runs: the prompt goes through the cache once, in pieces of at most the chunk,
    # then one token per step
    import fsframework.models.decode_cache as dc

    model = _model(name)
    seen = []
    forward = model.hidden_states
    monkeypatch.setattr(model, "hidden_states", lambda tokens, source: seen.append(tokens.shape[1])
                        or forward(tokens, source))
    monkeypatch.setattr(dc, "PREFILL_CHUNK", 16)
    greedy_generate(model, [_distinct_tokens(1, 35)[0].tolist()], 5)
    assert seen == [16, 16, 3] + [1] * 4
