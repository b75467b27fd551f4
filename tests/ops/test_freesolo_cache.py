"""FreeSolo over cached summaries (the per-block ops `route_candidates` / `cell_readout_kept`, and the
FreeSolo op over the decode states of `fsframework.ops.freesolo_decode`) selects the cells and reads the values that the
whole-sequence routing and readout do."""

from __future__ import annotations

import pytest
import torch

from fsframework.config import AttentionConfig, FsbConfig, ModelConfig
from fsframework.models.freesolo_attention import FreeSoloAttention
from fsframework.models.freesolo_settings import fs_config, fs_pair, fs_prior
from fsframework.ops.freesolo import cell_readout, cell_readout_kept, select_cells
from fsframework.ops.freesolo_decode import FSDecodeState, FSLDecodeState
from fsframework.ops.freesolo_driver import freesolo
from fsframework.ops.fsb_decode import FSBDecodeState
from fsframework.ops.freesolo_routing import cell_summaries, route_candidates

ROUTING = dict(cell_size=4, block_size=8, top_k=3, recent_cells=2, retained_cells=3)


def _qkv(seq: int, heads: int = 3, dim: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, seq, heads, dim, generator=gen, dtype=torch.float64) for _ in range(3)]


def test_route_and_read_over_every_cell_equal_the_whole_sequence_ops():
    q, k, v = _qkv(64)
    sigma, lam = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64), torch.tensor([0.5, 1.0, 0.0], dtype=torch.float64)
    cells = select_cells(q, k, *fs_pair(variant="fs", sigma=sigma, lam=lam, impl="reference", **ROUTING))
    weight = torch.rand(3, 8, dtype=torch.float64)
    full = cell_readout(q, k, v, cells, fs_config(cell_size=4, impl="reference"), rms_weight=weight)
    kbar, a = cell_summaries(k, 4)
    s = 4
    for block in (8, 24, 56):
        num = block // s
        rows = slice(block, block + 8)
        choice = route_candidates(q[:, rows], block, kbar[:, :num].transpose(1, 2), a[:, :num].transpose(1, 2),
                                  (torch.arange(num, dtype=torch.float64) + 0.5) * s, None,
                                  fs_prior(sigma=sigma, lam=lam), 3)
        assert torch.equal(choice, cells[:, rows])
        view = k[:, :num * s].view(2, num, s, 3, 8).permute(0, 3, 1, 2, 4).contiguous()
        values = v[:, :num * s].view(2, num, s, 3, 8).permute(0, 3, 1, 2, 4).contiguous()
        # a block of 8 queries (its union of cells read densely) and single queries
        block_read = cell_readout_kept(q[:, rows], view, values, choice, rms_weight=weight)
        torch.testing.assert_close(block_read, full[:, rows], rtol=1e-12, atol=1e-12)
        for i in range(block, block + 8, 3):
            one = cell_readout_kept(q[:, i:i + 1], view, values, choice[:, i - block:i - block + 1], rms_weight=weight)
            torch.testing.assert_close(one, full[:, i:i + 1], rtol=1e-12, atol=1e-12)


def test_rows_with_nothing_selected_read_zero():
    q, k, v = _qkv(8)
    choice = torch.full((2, 8, 3, 2), -1, dtype=torch.long)
    choice[1, 3, 0] = torch.tensor([1, -1])  # one query reads a cell, so the others are masked, not skipped
    cells = k[:, :8].view(2, 2, 4, 3, 8).permute(0, 3, 1, 2, 4).contiguous()
    out = cell_readout_kept(q, cells, cells, choice)
    assert torch.equal(out[0], torch.zeros_like(q[0])) and torch.equal(out[1, :3], torch.zeros_like(q[1, :3]))
    assert out[1, 3, 0].abs().sum() > 0 and torch.equal(out[1, 3, 1:], torch.zeros_like(q[1, 3, 1:]))
    assert torch.equal(cell_readout_kept(q, cells, cells, torch.full_like(choice, -1)), torch.zeros_like(q))
    # one query at a time (a decoded token: one fused, masked attention call) reads the same
    for i in (0, 3):
        one = cell_readout_kept(q[:, i:i + 1], cells, cells, choice[:, i:i + 1])
        torch.testing.assert_close(one, out[:, i:i + 1], rtol=1e-12, atol=1e-12)
        assert torch.equal(one[0], torch.zeros_like(one[0]))  # nothing selected: exactly 0, no NaN


def test_a_decoded_tokens_fp32_readout_equals_the_chunk_paths():
    q, k, v = (x.float() for x in _qkv(16))
    choice = torch.randint(-1, 4, (2, 1, 3, 3), generator=torch.Generator().manual_seed(1))
    choice[0, 0, 0] = -1  # a head without a cell
    k_cells, v_cells = (x.view(2, 4, 4, 3, 8).permute(0, 3, 1, 2, 4).contiguous() for x in (k, v))
    q1 = q[:, :1]
    one = cell_readout_kept(q1, k_cells, v_cells, choice)
    # the same query twice is a chunk of two queries: the chunk path
    two = cell_readout_kept(torch.cat((q1, q1), dim=1), k_cells, v_cells, torch.cat((choice, choice), dim=1))
    torch.testing.assert_close(one, two[:, :1], rtol=1e-5, atol=1e-6)
    assert torch.equal(one[0, 0, 0], torch.zeros(8))


@pytest.mark.parametrize("variant,state_class", [("fs", FSDecodeState), ("fsl", FSLDecodeState), ("fsb", FSBDecodeState)])
def test_decode_state_selects_the_cells_of_the_whole_sequence_routing(variant, state_class):
    # pieces of 1 to 8 positions over 20 blocks: FS-L's retained set merges and drops cells at every
    # boundary; FS-B's forests admit them (a beam of 4 < 40 cells)
    att = AttentionConfig(window=6, impl="reference", sigma=2.0, fsb=FsbConfig(beam_width=4, top_k=3), **ROUTING)
    cfg = ModelConfig(name=variant, vocab_size=16, d_model=24, n_layers=1, n_heads=3, attention=att)
    module = FreeSoloAttention(cfg, 0).double()
    q, k, v = _qkv(160, seed=1)
    if variant == "fsb":
        module.tau.copy_(torch.tensor([3.2, 3.4, 3.6]))  # Ftau admits a part of the cells
        module.tau_source = "test thresholds"
        settings = {key: value for key, value in ROUTING.items() if "cells" not in key}
        full = select_cells(q, k, *fs_pair(variant="fsb", sigma=module.sigma, lam=module.lam, tau=module.tau,
                                           beam_width=4, **settings))
    else:
        full = select_cells(q, k, *fs_pair(variant=variant, sigma=module.sigma, lam=module.lam, impl="reference",
                                           **ROUTING))
    state, pos, sizes = state_class(module.settings), 0, [5, 3, 1, 7, 8, 2, 6]
    while pos < 160:
        end = min(160, pos + sizes[pos % 7], (pos // 8 + 1) * 8)
        _, _, out = freesolo(q[:, pos:end], k[:, pos:end], v[:, pos:end], state.at(pos), module.settings,
                             module.prior, module.readout_gain())
        assert out is state and state.length == end  # advanced in place and returned
        assert torch.equal(state.selected, full[:, pos:end]), pos
        pos = end
    with pytest.raises(ValueError, match="holds 160 positions"):
        state.at(150)
