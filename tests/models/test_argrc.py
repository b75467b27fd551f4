"""AR-GRC (docs/argrc.md): the recipes' parameter counts, the model against the tree
definition written out here, cell and identity variants, dropout and config errors.
Cached decoding and sequence parallelism are covered by the tests that iterate over every
registry kind (tests/models/test_decode_cache.py, tests/parallel/test_sp_equivalence.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fsframework.config import ArgrcConfig, AttentionConfig, ConfigError, ModelConfig, load_config
from fsframework.models import build_model, count_parameters
from fsframework.models.argrc import ARGRCLanguageModel
from fsframework.models.argrc_blocks import aligned_blocks

YAMLS = Path(__file__).resolve().parents[2] / "yamls"


def _count(recipe: str) -> int:
    with torch.device("meta"):
        return count_parameters(build_model(load_config(YAMLS / recipe).model))


def test_owt2_recipe_has_the_papers_97_4m_parameters():
    # 50000*768 embedding + LN 2*768 + 768*1536+1536 + GRC (3072*6144+6144) + (6144*6144+6144)
    # + LN 2*1536 + e 1536 + 1536*768+768, tied head
    assert _count("argrc-owt2.yaml") == 97_403_136
    assert round(97_403_136 / 1e6, 1) == 97.4


def test_wt2_recipe_has_the_papers_16_6m_parameters():
    assert _count("argrc-wt2.yaml") == 16_561_536
    assert round(16_561_536 / 1e6, 1) == 16.6


def _tiny(**argrc) -> ARGRCLanguageModel:
    torch.manual_seed(0)
    cfg = ModelConfig(name="argrc", vocab_size=50, d_model=12, argrc=ArgrcConfig(d_state=10, **argrc),
                      attention=AttentionConfig(impl="reference"))
    return build_model(cfg).double().eval()


def _tree_prefix(model: ARGRCLanguageModel, h: torch.Tensor, t: int) -> torch.Tensor:
    """op(...op(op(e, S_1), S_2)..., S_m) over the dyadic blocks of t: the state after t leaves."""
    def reduce(block):
        if len(block) == 1:
            return block[0]
        half = len(block) // 2
        return model.cell(reduce(block[:half]), reduce(block[half:]))

    value, first = model.identity.expand(h.shape[0], -1), 0
    for bit in reversed(range(t.bit_length())):
        if t >> bit & 1:
            value = model.cell(value, reduce([h[:, i] for i in range(first, first + (1 << bit))]))
            first += 1 << bit
    return value


@pytest.mark.parametrize("argrc", [{}, {"cell": "mlp", "identity": "zeros", "post_merge_mlp_hidden": 6,
                                        "post_embed_mlp_hidden": 7}], ids=["grc", "mlp-zeros-mlps"])
def test_logits_follow_the_tree_and_ignore_what_comes_after(argrc):
    model = _tiny(**argrc)
    tokens = torch.randint(0, 50, (2, 13))
    with torch.no_grad():
        logits = model(tokens)
        h = model.leaves(tokens)
        for t in (0, 4, 6, 12):  # logits at t predict token t + 1 from tokens 0..t
            want = model.lm_head(model.readout(_tree_prefix(model, h, t + 1)))
            torch.testing.assert_close(logits[:, t], want, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(model(tokens[:, :5]), logits[:, :5], rtol=1e-12, atol=1e-14)


def test_passes_without_autograd_run_the_cell_in_row_tiles(monkeypatch):
    """Evaluation keeps a level's hidden layer cache-sized (docs/argrc.md §8); same logits."""
    import fsframework.models.argrc as argrc

    model = _tiny(post_merge_mlp_hidden=6)
    tokens = torch.randint(0, 50, (4, 70))  # 140 pairs at the first level
    with torch.enable_grad():
        want = model(tokens).detach()
    monkeypatch.setattr(argrc, "CELL_TILE_BYTES", 8 * 40 * 5)  # 5 rows of the 40-wide hidden, fp64: 64 rows
    assert model.scan.tile_rows() == 64
    monkeypatch.setattr(argrc, "CELL_TILE_BYTES", 8 * 40 * 100)
    assert model.scan.tile_rows() == 100
    rows = []
    model.scan.cell.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[0]))
    with torch.no_grad():
        got = model(tokens)
    assert max(rows) == 100 and sum(rows) > 100  # the widest levels were cut
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_identity_variants_and_state_dict():
    assert "identity" in _tiny().state_dict()
    assert "identity" not in _tiny(identity="zeros").state_dict()
    assert torch.equal(_tiny(identity="zeros").identity, torch.zeros(10, dtype=torch.float64))


def test_weights_saved_with_the_cell_at_the_top_still_load():
    source, target = _tiny(), _tiny()
    old_names = {key.replace("scan.cell.", "cell.", 1): value for key, value in source.state_dict().items()}
    assert any(key.startswith("cell.") for key in old_names)
    target.load_state_dict(old_names)
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key


def test_dropout_acts_in_training_only():
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="argrc", vocab_size=50, d_model=12, dropout=0.5,
                                    argrc=ArgrcConfig(post_embed_mlp_hidden=8)))
    tokens = torch.randint(0, 50, (1, 9))
    assert not torch.equal(model(tokens), model(tokens))
    model.eval()
    assert torch.equal(model(tokens), model(tokens))


def test_model_wide_dropout_reaches_the_transformer_kinds():
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="alibi", vocab_size=50, d_model=16, n_layers=1, n_heads=2, dropout=0.5))
    tokens = torch.randint(0, 50, (1, 9))
    assert not torch.equal(model(tokens), model(tokens))


def test_aligned_blocks_cut_a_range_into_dyadic_blocks():
    assert aligned_blocks(0, 13) == [(0, 8), (8, 4), (12, 1)]
    assert aligned_blocks(5, 17) == [(5, 1), (6, 2), (8, 8), (16, 1)]
    for start, end in ((0, 1), (3, 40), (64, 100)):
        blocks = aligned_blocks(start, end)
        assert sum(size for _, size in blocks) == end - start
        assert all(first % size == 0 for first, size in blocks)


@pytest.mark.parametrize("override, key", [("model.argrc.cell=rnn", "model.argrc.cell"),
                                           ("model.argrc.identity=ones", "model.argrc.identity"),
                                           ("model.dropout=1.5", "model.dropout"),
                                           ("model.argrc.d_state=-1", "model.argrc.d_state")])
def test_bad_keys_are_named(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, ["model.name=argrc", override])


def test_cached_decoding_of_every_variant():
    from fsframework.models.decode_cache import decode_cache

    model = _tiny(cell="mlp", identity="zeros", post_merge_mlp_hidden=6, post_embed_mlp_hidden=7)
    tokens = torch.randint(0, 50, (2, 21))
    with torch.no_grad():
        full = model(tokens)
        with decode_cache(model) as cache:
            pieces = [cache.forward(tokens[:, :1])] + [cache.forward(tokens[:, t:t + 1]) for t in range(1, 21)]
            assert len(cache.blocks) == bin(21).count("1")  # the stack: one root per set bit of the length
    torch.testing.assert_close(model.lm_head(torch.cat(pieces, dim=1)), full, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("chunk", [1, 4, 7, 64])
def test_prompts_prefill_in_chunks_as_slices_of_the_tree(chunk):
    """A prompt of 23 tokens in chunks, then single tokens, then 9 tokens at once at an odd
    length: every position's logits equal the full pass, and the stack is the binary counter."""
    from fsframework.models.decode_cache import decode_cache

    model = _tiny()
    tokens = torch.randint(0, 50, (2, 35))
    with torch.no_grad():
        full = model(tokens)
        with decode_cache(model, chunk=chunk) as cache:
            pieces = [cache.forward(tokens[:, :23])]
            pieces += [cache.forward(tokens[:, t:t + 1]) for t in (23, 24, 25)]
            pieces.append(cache.forward(tokens[:, 26:35]))
            assert [size for size, _ in cache.blocks] == [32, 2, 1]
            assert cache.nbytes == 3 * 2 * 10 * 8  # three roots [B, D] in fp64
    torch.testing.assert_close(model.lm_head(torch.cat(pieces, dim=1)), full, rtol=1e-9, atol=1e-9)
