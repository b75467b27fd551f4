"""`fsf export` directories: every kind round-trips bit-exactly, holds no pickle, reads back as a
checkpoint from anywhere, and bad input (truncated file, other size, other kind, a proof that
fails) is refused naming the problem."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from fsframework.checkpoints import Checkpoint, CheckpointError, init_from, initial_weights, load_model, read_config
from fsframework.config import SCHEMA_VERSION
from fsframework.export import ExportError, ProofFailed, export_checkpoint
from fsframework.models.registry import KINDS, build_model
from tests.export.helpers import random_checkpoint

TRAINABLE = [name for name, kind in KINDS.items() if kind.trainable]
NO_PICKLE_SUFFIXES = {".json", ".safetensors", ".yaml", ".py", ".model"}


@pytest.mark.parametrize("kind", TRAINABLE)
def test_export_round_trip_is_exact(kind, tmp_path):
    run = random_checkpoint(tmp_path / "run", kind)
    result = export_checkpoint(run, tmp_path / "out")
    assert result.max_difference == 0.0
    out = tmp_path / "out"
    assert {p.suffix for p in out.iterdir()} <= NO_PICKLE_SUFFIXES  # no pickle anywhere
    assert (out / "modeling_fsframework.py").is_file() == (kind != "tfpp")
    record = json.loads((out / "config.json").read_text())["fsframework"]
    assert record["schema_version"] == SCHEMA_VERSION and record["model"]["name"] == kind and record["version"]
    source = Checkpoint.open(run).state_dict()
    exported = Checkpoint.open(out).state_dict()
    assert source.keys() == exported.keys()
    assert all(torch.equal(source[k], exported[k]) for k in source)


def test_tied_embeddings_are_stored_once_and_tied_back(tmp_path):
    run = random_checkpoint(tmp_path / "run", "fs", "model.tie_embeddings=true")
    export_checkpoint(run, tmp_path / "out")
    stored = load_file(tmp_path / "out" / "model.safetensors")
    assert "model.lm_head.weight" not in stored and "model.embed.weight" in stored
    model, _ = load_model(tmp_path / "out")
    assert model.lm_head.weight is model.embed.weight
    fresh = build_model(read_config(tmp_path / "out").model)
    init_from(fresh, tmp_path / "out")  # `train.init_from`: the load path ties the stored embedding back too
    assert torch.equal(fresh.lm_head.weight, stored["model.embed.weight"])


def test_bf16_export_equals_the_rounded_source(tmp_path):
    from typer.testing import CliRunner

    from fsframework.cli import app

    run = random_checkpoint(tmp_path / "run", "tfpp")
    res = CliRunner().invoke(app, ["export", str(run), str(tmp_path / "out"), "--dtype", "bf16"])
    assert res.exit_code == 0, res.output
    assert "largest |logit difference| source vs export (bf16): 0\n" in res.output
    drift = float(res.output.split("fp32 source vs bf16 export (rounding): ")[1].split()[0])
    assert 0.0 < drift < 0.05  # bf16 rounding of the weights, no more
    assert {t.dtype for t in load_file(tmp_path / "out" / "model.safetensors").values()} == {torch.bfloat16}


def test_export_records_data_and_eval_settings_with_absolute_paths(tmp_path):
    """A run started in `tmp_path` with relative paths: the export names them from anywhere."""
    run = random_checkpoint(tmp_path / "runs" / "x", "tfpp", "run_dir=runs/x", "data.cache_dir=cache/emb",
                            "eval.lengths=[64,128]")
    export_checkpoint(run, tmp_path / "out")
    cfg = read_config(tmp_path / "out")
    assert cfg.data.cache_dir == str(tmp_path / "cache" / "emb")
    assert cfg.run_dir == str(tmp_path / "runs" / "x") and cfg.eval.lengths == [64, 128]


def test_file_tokenizer_and_calibration_travel(tmp_path):
    from fsframework.data.tokenizers import train_bpe_tokenizer

    train_bpe_tokenizer(["hello world, hello export"] * 20, 300, tmp_path / "tok.json")
    run = random_checkpoint(tmp_path / "run", "fs", f"data.tokenizer={tmp_path / 'tok.json'}", "model.vocab_size=300")
    ckpt = run / "checkpoints" / "step_00000001"
    (ckpt / "calibration.json").write_text(json.dumps({"tau": [[1.0, 2.0], [3.0, 4.0]]}))
    export_checkpoint(run, tmp_path / "out")
    out = tmp_path / "out"
    assert (out / "tokenizer.json").read_bytes() == (tmp_path / "tok.json").read_bytes()
    assert (out / "calibration.json").is_file() and (out / "tokenizer_config.json").is_file()
    assert Checkpoint.open(out).config().data.tokenizer == str(out / "tokenizer.json")
    model, _ = load_model(out, overrides=["model.name=fsb"])  # reads out/calibration.json
    assert model.fsb_calibration_file == str(out / "calibration.json")


def test_an_export_is_a_checkpoint_for_every_loader(tmp_path):
    run = random_checkpoint(tmp_path / "run", "argrc")
    export_checkpoint(run, tmp_path / "out")
    again = export_checkpoint(tmp_path / "out", tmp_path / "again")  # an export exports
    assert again.max_difference == 0.0
    assert Checkpoint.open(tmp_path / "out").run.scores == tmp_path / "out" / "eval" / "scores.json"


def _corrupt(out: Path) -> str:
    with pytest.raises(CheckpointError) as info:
        load_model(out)
    return str(info.value)


def test_a_truncated_export_is_named(tmp_path):
    export_checkpoint(random_checkpoint(tmp_path / "run", "tfpp"), tmp_path / "out")
    file = tmp_path / "out" / "model.safetensors"
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    message = _corrupt(tmp_path / "out")
    assert "model.safetensors" in message and "truncated" in message


def test_weights_of_another_size_or_kind_are_named(tmp_path):
    export_checkpoint(random_checkpoint(tmp_path / "run", "fs"), tmp_path / "out")
    export_checkpoint(random_checkpoint(tmp_path / "wide", "fs", "model.d_model=64"), tmp_path / "wide_out")
    export_checkpoint(random_checkpoint(tmp_path / "other", "argrc"), tmp_path / "other_out")
    target = tmp_path / "out" / "model.safetensors"
    shutil.copyfile(tmp_path / "wide_out" / "model.safetensors", target)
    message = _corrupt(tmp_path / "out")
    assert "mis-shaped" in message and "embed.weight (260, 64) (model: (260, 32))" in message
    shutil.copyfile(tmp_path / "other_out" / "model.safetensors", target)
    message = _corrupt(tmp_path / "out")
    missing, unexpected = message.split("missing ")[1].split("; unexpected ")
    assert "layers.0.attn_norm.weight" in missing and "identity" in unexpected


def test_a_failed_proof_writes_nothing(tmp_path, monkeypatch):
    import fsframework.export.writer as writer

    real = writer.export_tensors

    def off_by_a_little(state, model, dtype):
        tensors = real(state, model, dtype)
        tensors["model.norm.weight"] = tensors["model.norm.weight"] + 1e-3
        return tensors

    monkeypatch.setattr(writer, "export_tensors", off_by_a_little)
    with pytest.raises(ProofFailed, match="do not reproduce"):
        export_checkpoint(random_checkpoint(tmp_path / "run", "tfpp"), tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / ".tmp-out").exists()


def test_bad_export_input(tmp_path):
    run = random_checkpoint(tmp_path / "run", "tfpp")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ExportError, match="exists and is not empty"):
        export_checkpoint(run, tmp_path / "full")
    with pytest.raises(ExportError, match="--dtype 'fp16'"):
        export_checkpoint(run, tmp_path / "out", dtype="fp16")
    with pytest.raises(CheckpointError, match="checkpoint path not found"):
        export_checkpoint(tmp_path / "nowhere", tmp_path / "out")
    bad = tmp_path / "weights.safetensors"
    save_file({"x": torch.zeros(2)}, bad)
    bad.write_bytes(bad.read_bytes()[:20])
    with pytest.raises(CheckpointError, match="truncated or not a safetensors file"):
        initial_weights(bad)
