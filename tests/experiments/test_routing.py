"""Routing recall: how often FreeSolo's routing selects the cell of the token a copy needs."""

from __future__ import annotations

import math

import pytest
import torch

from experiments.routing import (eligible_cells, first_copy_start, freesolo_layers, readout_source_weight,
                                 routing_ablation, routing_recall, routing_report)
from fsframework.config import AttentionConfig, ModelConfig
from fsframework.data.synthetic import repeat_batch_with_sources
from fsframework.models.registry import build_model

WINDOW, CELL, BLOCK, TOP_K = 8, 4, 8, 2


def tiny(name: str):
    torch.manual_seed(0)
    attention = AttentionConfig(window=WINDOW, cell_size=CELL, block_size=BLOCK, top_k=TOP_K, retained_cells=3,
                                recent_cells=1)
    return build_model(ModelConfig(name=name, vocab_size=64, d_model=32, n_layers=2, n_heads=2,
                                   attention=attention)).eval()


def tied_routing(model):
    """Every routing score 0: ties pick the earliest TOP_K cells for every query."""
    for layer in model.modules():
        if hasattr(layer, "lam"):
            layer.lam.zero_()
            layer.wq.weight.data.zero_()
    return model


def counted_queries(source):
    """(row, query, source, eligible cells) of the queries recall counts, by the definition."""
    for b in range(source.shape[0]):
        for i in range(source.shape[1]):
            j = int(source[b, i])
            eligible = (i // BLOCK) * BLOCK // CELL
            if j >= 0 and i - j > WINDOW and j // CELL < eligible:
                yield b, i, j, eligible


def test_sources_point_at_the_token_each_second_copy_target_repeats():
    tokens, _, second, source = repeat_batch_with_sources(torch.Generator().manual_seed(1), 3, 96, 64, 24, 6)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    assert torch.equal(source >= 0, second)
    assert torch.equal(inputs.gather(1, source.clamp(min=0))[second], targets[second])
    positions = torch.arange(96).expand_as(source)
    assert bool((positions[second] - source[second] >= 1).all())  # a passage of n tokens: n - 1 back


def test_recall_counts_the_queries_that_need_the_long_range_branch_and_checks_their_cells():
    model = tied_routing(tiny("fs"))
    tokens, _, _, source = repeat_batch_with_sources(torch.Generator().manual_seed(2), 4, 96, 64, 40, 12)
    inputs = tokens[:, :-1]
    counted = hits = 0
    chance = []
    for _, _, j, eligible in counted_queries(source):
        counted += 1
        hits += j // CELL < TOP_K
        chance.append(min(1.0, TOP_K / eligible))
    assert counted > 50 and 0 < hits < counted
    for layer in routing_recall(model, inputs, source):
        assert layer["queries"] == counted
        assert layer["best_head"] == pytest.approx(hits / counted)
        assert layer["any_head"] == pytest.approx(hits / counted)
        assert layer["chance"] == pytest.approx(sum(chance) / counted)


def chance_of_span(first_cell: int, last_cell: int, eligible: int) -> float:
    """K random distinct cells of `eligible`: the chance one lies in first_cell..last_cell."""
    inside = min(last_cell, eligible - 1) - first_cell + 1
    return 1 - math.comb(eligible - inside, TOP_K) / math.comb(eligible, TOP_K)


def test_passage_and_reach_recall_count_cells_of_the_first_copy_and_of_the_positions_holding_the_source():
    model = tied_routing(tiny("fs"))
    tokens, _, _, source = repeat_batch_with_sources(torch.Generator().manual_seed(6), 4, 96, 64, 40, 12)
    starts = first_copy_start(source)
    expected = {"passage": [0, [], 0], "reach0": [0, [], 0], "reach1": [0, [], 0]}
    for b, i, j, eligible in counted_queries(source):
        start, n = int(starts[b, i]), i + 1 - j
        spans = {"passage": (start, start + n - 1), "reach0": (j, j), "reach1": (j, j + WINDOW)}
        for name, (lo, hi) in spans.items():  # inclusive token spans
            expected[name][0] += lo // CELL < TOP_K  # the span meets one of cells 0..TOP_K-1
            expected[name][1].append(chance_of_span(lo // CELL, hi // CELL, eligible))
            expected[name][2] += 1
    layers = routing_recall(model, tokens[:, :-1], source)
    for name, layer in (("passage", layers[0]), ("passage", layers[1]), ("reach0", layers[0]), ("reach1", layers[1])):
        hits, chances, counted = expected[name]
        prefix = name.rstrip("01") + "_"
        assert layer[f"{prefix}best_head"] == pytest.approx(hits / counted)
        assert layer[f"{prefix}any_head"] == pytest.approx(hits / counted)
        assert layer[f"{prefix}chance"] == pytest.approx(sum(chances) / counted)
    assert layers[1]["reach_chance"] > layers[1]["chance"]  # layer 1 reaches W more tokens
    assert layers[0]["passage_chance"] > layers[0]["chance"]


def test_first_copy_start_finds_where_each_copied_passage_began():
    # two passages [5 6 7] and [8 9], each followed by itself; targets are tokens[1:]
    source = torch.tensor([[-1, -1, -1, 1, 2, -1, -1, -1, 7, -1]])
    assert first_copy_start(source).tolist() == [[-1, -1, -1, 0, 0, -1, -1, -1, 6, -1]]
    tokens, _, second, source = repeat_batch_with_sources(torch.Generator().manual_seed(7), 3, 120, 64, 30, 4)
    starts, positions = first_copy_start(source), torch.arange(120).expand_as(source)
    n = positions + 1 - source
    for b, i in second.nonzero().tolist():
        s, length = int(starts[b, i]), int(n[b, i])
        assert s < int(source[b, i]) < s + length
        row = tokens[b].tolist()  # the first copy and the second copy (perhaps cut at the row end) agree
        shown = min(length, len(row) - s - length)
        assert shown >= 2 and row[s:s + shown] == row[s + length:s + length + shown]


def test_recall_of_an_untrained_model_is_near_chance_and_fsl_is_measured_too():
    tokens, _, _, source = repeat_batch_with_sources(torch.Generator().manual_seed(3), 8, 160, 64, 60, 20)
    for name in ("fs", "fsl"):
        layers = routing_recall(tiny(name), tokens[:, :-1], source)
        assert len(layers) == 2
        for layer in layers:
            assert layer["queries"] > 200
            assert 0 <= layer["best_head"] <= layer["any_head"] <= 1
            assert abs(layer["best_head"] - layer["chance"]) < 0.2


def test_readout_weight_on_the_source_is_uniform_without_content_and_matches_the_readout_op():
    from fsframework.ops.freesolo_readout import selected_cell_attention

    tokens, _, _, source = repeat_batch_with_sources(torch.Generator().manual_seed(2), 4, 96, 64, 40, 12)
    inputs = tokens[:, :-1]
    # q = 0: every selected token gets 1 / (K s); the heads select the same earliest cells
    hits = sum(j // CELL < TOP_K for _, _, j, _ in counted_queries(source))
    for layer in readout_source_weight(tied_routing(tiny("fs")), inputs, source):
        assert layer["pairs"] == 2 * hits and layer["uniform"] == 1 / (TOP_K * CELL)
        assert layer["mean"] == pytest.approx(layer["uniform"])
        assert layer["best_head"] == pytest.approx(layer["uniform"])
    # a trained-like model: the weight equals the readout op's output for a value that marks the source
    model = tiny("fs")
    for layer in freesolo_layers(model):
        layer.wq.weight.data.mul_(20)  # sharp logits, so a wrong token or cell would show
    measured = readout_source_weight(model, inputs, source)
    seen: dict[int, torch.Tensor] = {}
    hooks = [m.register_forward_pre_hook(lambda mod, args: seen.__setitem__(id(mod), args[0]))
             for m in freesolo_layers(model)]
    with torch.no_grad():
        model(inputs)
        for hook in hooks:
            hook.remove()
        for record, layer in zip(measured, freesolo_layers(model)):
            q, k, v = layer.project(seen[id(layer)])
            cells = layer.route(q, k)
            weights = []
            for b, i, j, _ in counted_queries(source):
                marker = torch.zeros_like(v)
                marker[b, j, :, 0] = 1.0
                y = selected_cell_attention(q, k, marker, cells, CELL)[b, i, :, 0]  # H
                holds = ((cells[b, i] == j // CELL).any(dim=-1))
                weights += y[holds].tolist()
            assert record["pairs"] == len(weights) > 20
            assert record["mean"] == pytest.approx(sum(weights) / len(weights), rel=1e-4)
            assert record["best_head"] >= record["mean"] - 1e-6
    with pytest.raises(ValueError, match="needs a FreeSolo model"):
        readout_source_weight(tiny("tfpp"), inputs, source)
    # the drill's one-pass report holds both measurements, the same numbers
    recall = routing_recall(model, inputs, source)
    for record, alone, weight in zip(routing_report(model, inputs, source), recall, measured, strict=True):
        assert record == {**alone, "readout_best_head": weight["best_head"], "readout_mean": weight["mean"],
                          "readout_pairs": weight["pairs"], "readout_chance": weight["uniform"]}


def test_recall_needs_a_freesolo_model():
    tokens, _, _, source = repeat_batch_with_sources(torch.Generator().manual_seed(4), 1, 32, 64, 8)
    with pytest.raises(ValueError, match="needs a FreeSolo model"):
        routing_recall(tiny("tfpp"), tokens[:, :-1], source)


def test_ablations_replace_the_routing_and_restore_it():
    model = tiny("fs")
    tokens = torch.randint(0, 64, (2, 48), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        learned = model(tokens)
        layer = freesolo_layers(model)[0]
        x = torch.randn(2, 48, 32)
        with routing_ablation(model, "off"):
            _, long_range = layer.branches(x)
            assert torch.equal(long_range, torch.zeros_like(long_range))  # nothing selected: LR = 0
            off = model(tokens)
        with routing_ablation(model, "random"):
            q, k, _ = layer.project(x)
            cells = layer.route(q, k)
            eligible = eligible_cells(48, CELL, BLOCK)
            for i in range(48):
                chosen = cells[0, i, 0].tolist()
                picked = [c for c in chosen if c >= 0]
                assert len(picked) == min(TOP_K, int(eligible[i])) and len(set(picked)) == len(picked)
                assert all(0 <= c < eligible[i] for c in picked)
            shuffled = model(tokens)
        again = model(tokens)
    assert torch.equal(again, learned)  # the learned routing is back
    assert not torch.allclose(off, learned) and not torch.allclose(shuffled, learned)
    # the first block routes nowhere in every mode, so its outputs agree
    torch.testing.assert_close(off[:, :BLOCK], learned[:, :BLOCK])
    with pytest.raises(ValueError, match="must be one of"):
        with routing_ablation(model, "oracle"):
            pass
