"""The analytic training FLOPs per token (fsframework.models.flops, docs/training.md "FLOPs per token")
against the work a real forward and backward pass of `build_model(cfg)` does, counted in multiply-adds
(tests/work.py): `2 x multiply-adds / tokens` of one row, for every trainable kind at two lengths."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from fsframework.config import AttentionConfig, ConfigError, FsbConfig, ModelConfig
from fsframework.config.kinds import KIND_FACTS
from fsframework.models import flops
from fsframework.models.flops import (KIND_FLOPS, dense_parameters, fsb_routing, fsb_search_levels,
                                      inference_flops_per_token, training_flops_per_token)
from fsframework.models.freesolo_attention import freesolo_layers, set_fsb_thresholds
from fsframework.models.registry import build_model
from fsframework.ops.freesolo import select_cells
from tests.work import WorkCounter

VOCAB, LENGTHS = 64, (256, 512)
# the formulas count what the implementation runs, so they agree exactly; a looser bound (10%) would
# let through an error in the small terms (routing, readout, the scan's edges) at these sizes
EXACT = 1e-9
TRAINABLE = [name for name, facts in KIND_FACTS.items() if facts.trainable]
# FreeSolo's sizes scaled down so that long-range reads happen at both lengths (16 and 32 query
# blocks, 64 and 128 cells). lam=0 routes by content alone, so a row's queries select different cells
# and the reference readout reads each query's own K cells (the layout the formula counts); with the
# prior at initialisation they all pick the same few large-norm cells, whose union it reads densely.
ATTENTION = AttentionConfig(window=16, cell_size=4, block_size=16, top_k=1, recent_cells=2, retained_cells=4,
                            lam=0.0, impl="reference")

# FS-B: a beam of 4 in forests of up to 124 cells, so 3 and 4 levels are ranked per query; one cell read
# per query, so the readout's union of a row's cells exceeds 16 K and each query reads its own (the
# layout the formula counts). Ftau's threshold 0.5 is about the median a_c of these weights at init:
# it holds about half the cells, its own tree shapes.
FSB_ATTENTION = replace(ATTENTION, fsb=FsbConfig(top_k=1, beam_width=4))
FSB_TAU = 0.5
# FS-B's search and rescoring are data-dependent and counted at their most: the counted forward is at
# most the formula and, on this model at both lengths, at least 1 / 1.25 of it
FSB_SLACK = 1.25


def _config(name: str) -> ModelConfig:
    return ModelConfig(name=name, vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=2,
                       attention=FSB_ATTENTION if name == "fsb" else ATTENTION)


def _counted_flops_per_token(cfg: ModelConfig, length: int) -> float:
    """2 x the multiply-adds of a forward and backward pass over one row, per token."""
    torch.manual_seed(0)
    model = build_model(cfg).train()
    tokens = torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(0))
    with WorkCounter() as work:
        model(tokens).float().logsumexp(dim=-1).mean().backward()
    assert work.macs > 0
    return 2 * work.macs / length


def _counted_forward(cfg: ModelConfig, length: int) -> tuple[float, float]:
    """2 x the multiply-adds of a forward over one row without gradient, per token: all of it, and the
    part the FreeSolo op's routing (`select_cells`) does (0 for another kind)."""
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    routing = []
    if cfg.name == "fsb":
        set_fsb_thresholds(model, [[FSB_TAU] * cfg.n_heads] * cfg.n_layers, source="test")

    def route(*args, **kwargs):  # the FreeSolo op's routing (`select_cells`), counted apart
        with WorkCounter() as inner:  # nested: the outer counter sees these products too
            cells = select_cells(*args, **kwargs)
        routing.append(inner.macs)
        return cells

    for layer in freesolo_layers(model):
        layer.router = route
    tokens = torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), WorkCounter() as work:
        model(tokens)
    assert work.macs > 0
    return 2 * work.macs / length, 2 * sum(routing) / length


@pytest.mark.parametrize("name", TRAINABLE)
def test_the_analytic_forward_flops_match_the_counted_work_of_a_forward(name):
    """Every trainable kind's inference count is the forward share of its training count, exactly."""
    cfg = _config(name)
    for length in LENGTHS:
        analytic, (counted, _) = inference_flops_per_token(cfg, length), _counted_forward(cfg, length)
        assert analytic == pytest.approx(counted, rel=EXACT), (name, length, analytic / counted)


def test_fsb_inference_flops_bound_the_counted_forward():
    """FS-B: all but the routing (weights, window, readout) is exact; the routing's counted work is at
    most its formula (the search's depth and distinct nodes, the rescored union and Ftau's cells at
    their most), and the whole forward within FSB_SLACK of the formula."""
    cfg = _config("fsb")
    for length in LENGTHS:
        analytic, (counted, routed) = inference_flops_per_token(cfg, length), _counted_forward(cfg, length)
        bound = cfg.n_layers * fsb_routing(cfg, length)
        assert analytic - bound == pytest.approx(counted - routed, rel=EXACT)
        assert 0 < routed <= bound
        assert counted <= analytic <= FSB_SLACK * counted, (length, counted / analytic)


def test_fsb_grows_with_the_length_as_its_formula_says():
    """Between the lengths only FS-B's window edge and routing change per token: the exact part grows
    as counted, and the search ranks one more level per doubling of the cells (a forest of M cells is
    ceil(log2 M) deep, the first floor(log2 Wb) levels walked without a product)."""
    cfg = _config("fsb")
    short, long = LENGTHS
    (c_short, r_short), (c_long, r_long) = (_counted_forward(cfg, n) for n in LENGTHS)
    (a_short, b_short), (a_long, b_long) = ((inference_flops_per_token(cfg, n), cfg.n_layers * fsb_routing(cfg, n))
                                            for n in LENGTHS)
    assert (a_long - b_long) - (a_short - b_short) == pytest.approx((c_long - r_long) - (c_short - r_short), rel=EXACT)
    assert b_long > b_short and r_long > r_short
    width = cfg.attention.fsb.beam_width
    cells = [n // cfg.attention.cell_size - cfg.attention.block_size // cfg.attention.cell_size for n in LENGTHS]
    assert fsb_search_levels(cells[0], width) == [8, 16, 16, 16]  # 60 cells: depth 6, 2 levels walked
    assert fsb_search_levels(cells[1], width) == [8, 16, 16, 16, 16]  # 124 cells: depth 7
    assert fsb_search_levels(width, width) == []  # a forest the beam holds whole: no product


@pytest.mark.parametrize("name", TRAINABLE)
def test_the_analytic_flops_match_the_counted_work_of_a_training_step(name):
    cfg = _config(name)
    for length in LENGTHS:
        analytic, counted = training_flops_per_token(cfg, length), _counted_flops_per_token(cfg, length)
        assert analytic == pytest.approx(counted, rel=EXACT), (name, length, analytic / counted)


def test_tfpp_is_6n_plus_its_causal_attention():
    """TF++: 6 FLOPs per weight of its Linear layers, plus a fused causal call per layer over T / 2 keys
    on average: 2 x (T / 2) x 2D forward, x (1 + 2.5) with its backward (which recomputes the scores)."""
    cfg = _config("tfpp")
    model = build_model(cfg)
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    assert dense_parameters(cfg) == weights
    for length in LENGTHS:
        assert training_flops_per_token(cfg, length) == 6 * weights + cfg.n_layers * 7 * length * cfg.d_model


def test_fs_grows_with_the_length_as_its_formula_says():
    """What changes between the lengths (routing over more cells, the window's edge) is what the formula
    says: the counted growth of FS's per-token work equals the analytic growth."""
    cfg = _config("fs")
    (a_short, a_long), (c_short, c_long) = ([f(cfg, n) for n in LENGTHS]
                                            for f in (training_flops_per_token, _counted_flops_per_token))
    assert a_long > a_short
    assert a_long - a_short == pytest.approx(c_long - c_short, rel=EXACT)


def test_sequence_parallel_ranks_share_the_row():
    cfg = _config("fs")
    assert training_flops_per_token(cfg, 512, sp=4) == pytest.approx(training_flops_per_token(cfg, 512) / 4)


def test_every_trainable_kind_has_a_formula():
    assert sorted(KIND_FLOPS) == sorted(TRAINABLE)


def test_a_read_path_or_an_unknown_kind_fails_in_one_line():
    with pytest.raises(ConfigError, match="model.name=fsb is a read path only.*model.name=fs"):
        training_flops_per_token(_config("fsb"), 256)
    with pytest.raises(ConfigError, match="'nope' is not registered"):
        training_flops_per_token(ModelConfig(name="nope"), 256)
    with pytest.raises(ConfigError, match="'nope' is not registered"):
        inference_flops_per_token(ModelConfig(name="nope"), 256)


def test_the_formulas_read_only_the_config():
    """fsframework.models.flops imports nothing but the config (no torch): a launcher or a log
    reader computes FLOPs without building a model."""
    tree = ast.parse(Path(flops.__file__).read_text())
    modules = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    modules |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert all(m == "__future__" or m == "typing" or m.startswith("fsframework.config") for m in modules), modules
