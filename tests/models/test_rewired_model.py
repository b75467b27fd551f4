"""model.name=rewired: the recipes' parameter counts against the paper's Table 1, the bilinear
matrix, the ablation switches through the decode cache, and the config checks (docs/rewired.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fsframework.config import AttentionConfig, ConfigError, ModelConfig, RewiredConfig, load_config
from fsframework.models.decode_cache import decode_cache
from fsframework.models.registry import build_model, count_parameters

REPO = Path(__file__).resolve().parents[2]

# d -> (the paper's count, this recipe's count). Convention here: tied embeddings, SwiGLU of
# width round(8 d_model / 3), RMSNorm gains, no biases; docs/rewired.md §5 states the difference.
TABLE_1 = {
    8: (50_927_104, 50_902_016),
    12: (123_607_296, 123_551_232),
    16: (252_890_112, 252_839_936),
    20: (457_726_720, 457_571_840),
    24: (756_969_984, 756_747_264),
}


@pytest.mark.parametrize("d", sorted(TABLE_1))
def test_recipe_parameter_counts_against_table_1(d):
    cfg = load_config(REPO / "yamls" / f"rewired-d{d}.yaml").model
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.vocab_size) == (64 * d, d, d, 50_257)
    with torch.device("meta"):
        count = count_parameters(build_model(cfg))
    paper, ours = TABLE_1[d]
    assert count == ours
    assert abs(count - paper) / paper < 5e-4
    # the bilinear score adds exactly n_layers * 64^2 (the paper's Table 5 deltas)
    cfg.attention.rewired.score = "bilinear"
    with torch.device("meta"):
        assert count_parameters(build_model(cfg)) - count == d * 64 * 64


def _model(**rewired) -> torch.nn.Module:
    att = AttentionConfig(impl="reference", rewired=RewiredConfig(**rewired))
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="rewired", vocab_size=61, d_model=32, n_layers=2, n_heads=2, attention=att))
    return model.double().eval()


def test_bilinear_matrix_starts_as_identity_and_equals_dot_there():
    dot, bilinear = _model(), _model(score="bilinear")
    for layer in bilinear.layers:
        torch.testing.assert_close(layer.attn.bmat, torch.eye(16, dtype=torch.float64))
    tokens = torch.randint(0, 61, (1, 30))
    with torch.no_grad():
        torch.testing.assert_close(bilinear(tokens), dot(tokens))


@pytest.mark.parametrize("runway, score, head", [("mean", "dot", 0), ("last", "bilinear", 1), ("mean", "bilinear", 1)])
def test_ablations_decode_like_the_full_forward(runway, score, head):
    model = _model(runway=runway, score=score, head=head)
    if score == "bilinear":  # move Bmat off the identity so it matters
        for layer in model.layers:
            layer.attn.bmat.data += 0.2 * torch.randn(16, 16, dtype=torch.float64)
    tokens = torch.randint(0, 61, (2, 40))
    with torch.no_grad():
        full = model(tokens)
        with decode_cache(model) as cache:
            pieces = [cache.forward(tokens[:, :13])] + [cache.forward(tokens[:, t:t + 1]) for t in range(13, 40)]
    torch.testing.assert_close(model.lm_head(torch.cat(pieces, dim=1)), full, rtol=1e-9, atol=1e-9)


def test_runway_changes_the_model():
    tokens = torch.randint(0, 61, (1, 30))
    with torch.no_grad():
        a, b = _model()(tokens), _model(runway="mean")(tokens)
    assert not torch.allclose(a, b)
    assert torch.allclose(a[:, :2], b[:, :2])  # t < 2 has no biased source


@pytest.mark.parametrize("override, match", [
    ("model.attention.rewired.runway=first", "model.attention.rewired.runway"),
    ("model.attention.rewired.score=cosine", "model.attention.rewired.score"),
    ("model.attention.rewired.head=4", "model.attention.rewired.head"),
])
def test_config_errors_name_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(REPO / "yamls" / "rewired-cpu.yaml", [override])
