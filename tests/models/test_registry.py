"""The registry entry is all a kind needs: its facts (`fsframework.config.kinds`) and its classes."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
import torch

from fsframework.config import AttentionConfig, Config, ConfigError, ModelConfig, validate
from fsframework.config.kinds import KIND_FACTS, KindFacts, kind_facts
from fsframework.models import registry
from fsframework.models.attention import SlidingWindowAttention
from fsframework.models.freesolo_attention import FreeSoloAttention
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


@pytest.mark.parametrize("lookup", [registry.attention_kind, kind_facts])
def test_unknown_kind_is_one_line_naming_the_registered_ones(lookup):
    with pytest.raises(ConfigError) as error:
        lookup("nope")
    assert str(error.value) == f"model.name='nope' is not registered; choose one of {', '.join(KIND_FACTS)}"
    assert "\n" not in str(error.value) and "tfpp, swa" in str(error.value)


def test_validation_refuses_an_unknown_kind_by_the_table():
    with pytest.raises(ConfigError, match="model.name='nope' is not allowed; choose one of tfpp, swa"):
        validate(Config(model=ModelConfig(name="nope")))


def test_the_registry_takes_its_facts_from_the_config_table():
    assert registry.MODEL_NAMES == tuple(KIND_FACTS)
    assert all(kind.facts is KIND_FACTS[name] for name, kind in registry.KINDS.items())
    assert registry.attention_kind("fsb").routing == "fsb" and not registry.attention_kind("fsb").trainable
    for kind in registry.KINDS.values():  # the classes agree with the facts they are filed under
        assert (kind.language_model is None) == kind.decoder_blocks, kind.name
        assert (kind.module is None) == (kind.keys == ""), kind.name
        assert (kind.module is FreeSoloAttention) == kind.freesolo, kind.name


def test_the_registry_holds_classes_not_dotted_names():
    # a "package.module:Class" string hides the import from the reader, the linter and the layering test
    source = (Path(registry.__file__)).read_text()
    tree = ast.parse(source)
    dotted = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
              and re.fullmatch(r"fsframework(\.\w+)+[:.]\w+", n.value)]
    assert not dotted, dotted
    imported = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assert "importlib" not in imported and "import_module" not in source
    for kind in registry.KINDS.values():
        assert all(c is None or isinstance(c, type) for c in (kind.module, kind.language_model))
        # a layer cache: a class, or the function that builds FreeSolo's decode state from the layer
        assert kind.cache is None or isinstance(kind.cache, type) or inspect.isfunction(kind.cache)


def test_a_new_entry_is_enough_for_cached_decoding(monkeypatch):
    # a kind that exists only as an entry: NoPE attention over a window, no new code anywhere
    entry = registry.AttentionKind(KindFacts("nope_window", "window", "test kind"), SlidingWindowAttention)
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
