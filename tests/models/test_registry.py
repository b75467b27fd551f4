"""The registry entry is all a kind needs: module, key span, positions."""

from __future__ import annotations

import pytest
import torch

from fsframework.config import AttentionConfig, ConfigError, ModelConfig
from fsframework.models import registry
from fsframework.models.attention import SlidingWindowAttention
from fsframework.models.context import RetainedCells
from fsframework.models.decode_cache import decode_cache


def test_key_span_follows_the_entry():
    att = AttentionConfig(window=24)
    assert registry.attention_kind("swa").key_span(att) == 24
    for name in ("tfpp", "alibi", "sinusoidal", "fs"):
        assert registry.attention_kind(name).key_span(att) is None
    # FS-L reads the prefix through its cells: the span says which (fsframework.parallel.retained)
    assert registry.attention_kind("fsl").key_span(att) == RetainedCells(att.cell_size, att.recent_cells,
                                                                           att.retained_cells, 24)


def test_built_modules_carry_their_span():
    cfg = ModelConfig(name="swa", vocab_size=32, d_model=16, n_layers=2, n_heads=2,
                      attention=AttentionConfig(window=6, impl="reference"))
    model = registry.build_model(cfg)
    assert all(isinstance(layer.attn, SlidingWindowAttention) and layer.attn.key_span == 6 for layer in model.layers)


def test_unknown_kind_names_the_registered_ones():
    with pytest.raises(ConfigError, match="tfpp, swa"):
        registry.attention_kind("nope")


def test_a_new_entry_is_enough_for_cached_decoding(monkeypatch):
    # a kind that exists only as an entry: NoPE attention over a window, no new code anywhere
    entry = registry.AttentionKind("nope_window", "fsframework.models.attention:SlidingWindowAttention", "window",
                                   "test kind")
    monkeypatch.setitem(registry.KINDS, entry.name, entry)
    cfg = ModelConfig(name="nope_window", vocab_size=32, d_model=16, n_layers=2, n_heads=2,
                      attention=AttentionConfig(window=5, impl="reference"))
    torch.manual_seed(0)
    model = registry.build_model(cfg).double().eval()
    tokens = torch.randint(0, 32, (1, 23))
    with torch.no_grad(), decode_cache(model) as cache:
        steps = [cache.forward(tokens[:, :7])] + [cache.forward(tokens[:, t:t + 1]) for t in range(7, 23)]
        # the span bounds the cache: a ring of 5 positions per layer
        assert all(layer.kv.k.shape[1] == 5 and layer.nbytes == 2 * 5 * 16 * 8 for layer in cache.layers.values())
        torch.testing.assert_close(model.lm_head(torch.cat(steps, dim=1)), model(tokens), rtol=1e-9, atol=1e-9)
