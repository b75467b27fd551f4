"""`model.attention.route_score` (docs/freesolo.md "Departures"): routing's content term by the cell's
token keys ("tokens": log-sum-exp of the token logits) instead of its mean key ("mean", Eq. 7, the paper's).

Checked: the setting's round trip through the config and the recipe that ships it (yamls/mqar-cpu.yaml;
every other recipe keeps the paper's), the score against a brute-force reference of its definition, a
cell the mean key misses and the token keys find, its effect on a small model's forward, the decode
states selecting what whole-sequence routing selects, and the paths that cannot score by token keys
(the routing kernel, routing from gathered summaries) refusing it by name.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from fsframework.config import AttentionConfig, ConfigError, FsbConfig, ModelConfig, load_config
from fsframework.config.yaml_io import load_run_config, to_yaml
from fsframework.models.freesolo_attention import FreeSoloAttention
from fsframework.models.freesolo_settings import fs_pair
from fsframework.ops.freesolo import select_cells, select_cells_from_summaries, summarize_cells
from fsframework.ops.freesolo_decode import FSDecodeState, FSLDecodeState
from fsframework.ops.freesolo_driver import freesolo

REPO = Path(__file__).resolve().parents[1]
ROUTING = dict(cell_size=4, block_size=8, top_k=3, recent_cells=2, retained_cells=3)


def _qkv(seq: int, heads: int = 3, dim: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, seq, heads, dim, generator=gen, dtype=torch.float64) for _ in range(3)]


def _brute_force(q, k, cell_size, block_size, top_k, sigma, lam):
    """Every query's top-K cells by `logsumexp_j(q . k_j / sqrt(d)) + lam a_c erf((i - p_c) / 2 sigma)`,
    one query and head at a time (ties: the earlier cell; -1 where fewer are eligible)."""
    bsz, seq, heads, dim = q.shape
    out = torch.full((bsz, seq, heads, top_k), -1, dtype=torch.long)
    for b in range(bsz):
        for i in range(seq):
            eligible = (i // block_size) * block_size // cell_size
            for h in range(heads):
                scores = []
                for c in range(eligible):
                    keys = k[b, c * cell_size:(c + 1) * cell_size, h]
                    content = torch.logsumexp(keys @ q[b, i, h] / math.sqrt(dim), dim=0)
                    a = keys.norm(dim=-1).max()
                    center = (c + 0.5) * cell_size
                    scores.append(float(content + lam * a * math.erf((i - center) / (2 * sigma))))
                order = sorted(range(eligible), key=lambda c: (-scores[c], c))[:top_k]
                out[b, i, h, :len(order)] = torch.tensor(order, dtype=torch.long)
    return out


def test_the_schema_default_is_the_papers_and_a_wrong_value_fails():
    assert AttentionConfig().route_score == "mean"
    with pytest.raises(ConfigError, match="route_score"):
        load_config(None, ["model.name=fs", "model.attention.route_score=max"])


def test_the_mqar_recipe_ships_token_scores_and_they_round_trip(tmp_path):
    cfg = load_config(REPO / "yamls" / "mqar-cpu.yaml")
    assert cfg.model.attention.route_score == "tokens"
    assert cfg.model.attention.retained_cells == 12  # FS-L keeps more cells than a row's 8 pairs
    saved = tmp_path / "config.yaml"
    saved.write_text(to_yaml(cfg))
    assert load_run_config(saved).model.attention.route_score == "tokens"
    # a run saved before the key existed reads with the paper's score
    old = "\n".join(line for line in to_yaml(cfg).splitlines() if "route_score" not in line)
    saved.write_text(old)
    assert load_run_config(saved).model.attention.route_score == "mean"
    # an override reaches the layer's settings
    assert FreeSoloAttention(load_config(REPO / "yamls" / "mqar-cpu.yaml", ["model.attention.route_score=mean"]).model,
                             0).settings.route_score == "mean"


def test_every_other_recipe_keeps_the_papers_score():
    for path in sorted((REPO / "yamls").glob("*.yaml")):
        if path.name == "mqar-cpu.yaml":
            continue
        text = path.read_text()
        assert "route_score" not in text, path.name


@pytest.mark.parametrize("variant", ["fs", "fsl"])
def test_token_scores_select_the_brute_force_top_k(variant):
    q, k, _ = _qkv(48, heads=2, dim=4, seed=3)
    config, prior = fs_pair(variant=variant, sigma=2.0, lam=0.5, impl="reference", route_score="tokens",
                            **{**ROUTING, "retained_cells": 12})  # FS-L keeping every cell routes as FS
    got = select_cells(q, k, config, prior)
    assert torch.equal(got, _brute_force(q, k, 4, 8, 3, 2.0, 0.5))
    mean = select_cells(q, k, config.replace(route_score="mean"), prior)
    assert not torch.equal(got, mean)  # the setting changes what is read


def test_token_scores_find_the_cell_whose_mean_key_hides_its_match():
    # cell 0: one key on the query's direction and three against it (mean ~ 0); cell 1: four keys a
    # little along it. The mean key prefers cell 1, the token keys cell 0, which holds the match.
    dim, s = 4, 4
    direction = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    k = torch.zeros(1, 16, 1, dim, dtype=torch.float64)
    k[0, 0, 0] = 6 * direction
    k[0, 1:4, 0] = -2 * direction
    k[0, 4:8, 0] = 1 * direction
    q = torch.zeros(1, 16, 1, dim, dtype=torch.float64)
    q[0, 8:, 0] = 2 * direction
    config, prior = fs_pair(variant="fs", cell_size=s, block_size=8, top_k=1, sigma=2.0, lam=0.0,
                            impl="reference")
    assert int(select_cells(q, k, config, prior)[0, 8, 0, 0]) == 1
    assert int(select_cells(q, k, config.replace(route_score="tokens"), prior)[0, 8, 0, 0]) == 0


def test_the_setting_changes_a_small_models_forward():
    torch.manual_seed(0)
    overrides = ["model.attention.impl=reference"]
    tokens_cfg = load_config(REPO / "yamls" / "mqar-cpu.yaml", overrides)
    mean_cfg = load_config(REPO / "yamls" / "mqar-cpu.yaml", [*overrides, "model.attention.route_score=mean"])
    from fsframework.models.registry import build_model

    model = build_model(tokens_cfg.model).eval()
    paper = build_model(mean_cfg.model).eval()
    paper.load_state_dict(model.state_dict())
    layers = [m for m in model.modules() if isinstance(m, FreeSoloAttention)]
    assert layers and all(m.settings.route_score == "tokens" and not m.routes_from_summaries for m in layers)
    # a row whose long range reads differ: 256 tokens = 32 cells of 8
    x = torch.randint(0, tokens_cfg.model.vocab_size, (2, 256), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out, ref = model(x), paper(x)
    assert torch.isfinite(out).all()
    assert not torch.allclose(out, ref)  # the routed cells, hence the logits, differ
    assert torch.equal(out[:, :tokens_cfg.model.attention.block_size], ref[:, :tokens_cfg.model.attention.block_size])


@pytest.mark.parametrize("variant,state_class", [("fs", FSDecodeState), ("fsl", FSLDecodeState)])
def test_decode_states_select_what_whole_sequence_token_routing_selects(variant, state_class):
    att = AttentionConfig(window=6, impl="reference", sigma=2.0, route_score="tokens",
                          fsb=FsbConfig(beam_width=4, top_k=3), **ROUTING)
    cfg = ModelConfig(name=variant, vocab_size=16, d_model=24, n_layers=1, n_heads=3, attention=att)
    module = FreeSoloAttention(cfg, 0).double()
    q, k, v = _qkv(96, seed=1)
    full = select_cells(q, k, *fs_pair(variant=variant, sigma=module.sigma, lam=module.lam, impl="reference",
                                       route_score="tokens", **ROUTING))
    state, pos, sizes = state_class(module.settings), 0, [5, 3, 1, 7, 8, 2, 6]
    while pos < 96:
        end = min(96, pos + sizes[pos % 7], (pos // 8 + 1) * 8)
        freesolo(q[:, pos:end], k[:, pos:end], v[:, pos:end], state.at(pos), module.settings, module.prior,
                 module.readout_gain())
        assert torch.equal(state.selected, full[:, pos:end]), pos
        pos = end


def test_paths_without_token_scores_refuse_the_setting_by_name():
    q, k, _ = _qkv(32)
    config, prior = fs_pair(variant="fs", route_score="tokens", impl="triton", **ROUTING)
    with pytest.raises(ValueError, match="route_score='tokens'"):
        select_cells(q, k, config, prior)  # the routing kernel scores mean keys only
    reference = config.replace(impl="reference")
    kbar, a = summarize_cells(k, reference)
    with pytest.raises(ValueError, match="route_score='tokens'"):
        select_cells_from_summaries(q, kbar, a, reference, prior)  # sequence parallelism's gathered summaries
