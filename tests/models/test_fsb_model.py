"""FS-B as a model (docs/freesolo.md §1.8): FS weights read with forest search and calibrated thresholds."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from fsframework.cli import app
from fsframework.config import AttentionConfig, ConfigError, FsbConfig, ModelConfig
from fsframework.models.freesolo_attention import freesolo_layers, set_fsb_thresholds
from fsframework.models.registry import build_model, check_trainable
from tests.utils import REPO


def _model(name: str, impl: str = "reference", **fsb):
    att = AttentionConfig(window=12, cell_size=4, block_size=8, top_k=2, sigma=2.0, impl=impl, fsb=FsbConfig(**fsb))
    torch.manual_seed(0)
    return build_model(ModelConfig(name=name, vocab_size=64, d_model=32, n_layers=2, n_heads=2, attention=att))


def test_fs_weights_load_into_fsb_and_read_fsb_top_k_cells():
    fs, fsb = _model("fs"), _model("fsb", top_k=3, beam_width=4)
    fsb.load_state_dict(fs.state_dict(), strict=True)  # same parameters and saved buffers
    set_fsb_thresholds(fsb, [[0.1, 0.2], [0.3, 0.4]], "thresholds.json")
    layer = freesolo_layers(fsb)[1]
    assert layer.tau.tolist() == pytest.approx([0.3, 0.4]) and layer.tau_source == "thresholds.json"
    q, k = torch.randn(1, 40, 2, 16), torch.randn(1, 40, 2, 16)
    assert layer.route(q, k).shape == (1, 40, 2, 3)
    tokens = torch.randint(0, 64, (2, 40))
    with torch.no_grad():
        assert torch.isfinite(fsb(tokens)).all()


@pytest.mark.parametrize("impl", ["reference", "auto"])
def test_the_search_runs_the_configured_impl(impl, monkeypatch):
    """The whole-sequence forward and the decode cache hand `model.attention.impl` to FS-B's search
    (which runs its kernel where the dispatcher picks it: tests/kernels/test_fsb_search.py)."""
    import fsframework.ops.fsb_search as search
    from fsframework.models.decode_cache import decode_cache

    asked = []
    real = search.kernel_for

    def recording(module, name, impl_, tensor, unsupported=None):
        asked.append((module, name, impl_))
        return real(module, name, impl_, tensor, unsupported)

    monkeypatch.setattr(search, "kernel_for", recording)
    model = _model("fsb", impl=impl, beam_width=4).eval()
    set_fsb_thresholds(model, [[0.1, 0.2], [0.3, 0.4]], "test thresholds")
    tokens = torch.randint(0, 64, (1, 30))
    with torch.no_grad():
        model(tokens)
        whole = len(asked)
        with decode_cache(model, chunk=8) as cache:
            cache.forward(tokens[:, :20])
            cache.forward(tokens[:, 20:21])
    assert whole > 0 and len(asked) > whole  # both paths searched
    assert set(asked) == {("fsb_search", "beam_search", impl)}


def test_fsb_without_calibration_names_fsf_calibrate():
    with pytest.raises(ValueError, match="fsf calibrate"):
        _model("fsb")(torch.randint(0, 64, (1, 24)))
    with torch.no_grad():  # F0 alone needs no thresholds
        assert torch.isfinite(_model("fsb", forests="f0")(torch.randint(0, 64, (1, 24)))).all()


@pytest.mark.parametrize("tau, match", [
    ([[0.1, 0.2]], "2 layers x 2 heads"),  # another model size
    ([[0.1, 0.2, 0.3], [0.1, 0.2, 0.3]], "2 layers x 2 heads"),
    ([[0.1, float("nan")], [0.1, 0.2]], "finite"),
    ([[0.1, float("inf")], [0.1, 0.2]], "finite"),
    ({"tau": 1}, "2 layers x 2 heads"),
])
def test_bad_thresholds_are_refused(tau, match):
    with pytest.raises(ValueError, match=match):
        set_fsb_thresholds(_model("fsb"), tau, "calibration.json")


def test_training_fsb_is_refused_with_the_kind_to_train(tmp_path):
    with pytest.raises(ConfigError, match="train model.name=fs"):
        check_trainable("fsb")
    check_trainable("fs")
    res = CliRunner().invoke(app, ["train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={tmp_path}",
                                   "model.name=fsb"])
    assert res.exit_code == 2 and "inference-only" in res.output and "model.name=fs" in res.output


def test_fsb_config_keys_are_checked():
    from fsframework.config import load_config

    with pytest.raises(ConfigError, match=r"fsb\.beam_width=2 must be >= model\.attention\.fsb\.top_k=4"):
        load_config(None, ["model.name=fsb", "model.attention.fsb.beam_width=2"])
    with pytest.raises(ConfigError, match=r"model\.attention\.fsb\.forests"):
        load_config(None, ["model.attention.fsb.forests=all"])


def test_fsb_recipes():
    """FS 800M base and the two recall-weighted CPT stages (docs/freesolo.md §1.10)."""
    from fsframework.config import load_config
    from fsframework.models.registry import count_parameters
    from fsframework.train.schedule import lr_factor

    base = load_config(REPO / "yamls" / "fs-800m.yaml")
    with torch.device("meta"):
        assert 700e6 < count_parameters(build_model(base.model)) < 850e6
    for stage, beta_switch, init in ((1, 9.0, "runs/fs-800m"), (2, 49.0, "runs/fsb-800m-cpt-stage1")):
        cfg = load_config(REPO / "yamls" / f"fsb-800m-cpt-stage{stage}.yaml")
        assert cfg.model.name == "fs" and cfg.model.attention.top_k == 16 and cfg.train.init_from == init
        assert cfg.model == base.model.__class__(**{**vars(base.model), "attention": cfg.model.attention})
        assert (cfg.loss.recall_weighting, cfg.loss.beta, cfg.loss.beta_switch) == (True, 9.0, beta_switch)
        assert cfg.train.max_steps == 800 and cfg.optim.warmup_steps == 20
        assert cfg.data.seq_len * cfg.data.micro_batch_size * cfg.parallel.grad_accum * 16 == 262_144  # 16 ranks
        lrs = [cfg.optim.lr * lr_factor(step, 800, cfg.optim) for step in (19, 799)]
        assert lrs[0] == pytest.approx(4e-5) and lrs[1] == pytest.approx(4e-6, rel=1e-3)
