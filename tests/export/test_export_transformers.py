"""Transformers reads the exports (CPU): a tfpp export is a native Llama, every other kind loads
through the modeling file it carries; logits match ours and `generate()` decodes as we do.
`fsf import` reads a Llama checkpoint back as a tfpp model, proved against transformers."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from fsframework.checkpoints import Checkpoint, load_model
from fsframework.eval.decoding import greedy_generate
from fsframework.export import ExportError, export_checkpoint, import_llama
from fsframework.export.proof import logits_of, max_difference, proof_batch
from tests.export.helpers import random_checkpoint

transformers = pytest.importorskip("transformers")  # a dev dependency (pyproject.toml)


def _ours_and_theirs(out, **kwargs):
    ours, cfg = load_model(out)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, **kwargs).eval()
    return ours, theirs, proof_batch(cfg.model.vocab_size)


def _same_generation(ours, theirs, tokens):
    prompt = tokens[:1, :12]
    generated = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False,
                                pad_token_id=0)
    assert generated[0, 12:].tolist() == greedy_generate(ours, [prompt[0].tolist()], 6)[0]


@pytest.mark.parametrize("tie", [False, True])
def test_tfpp_export_is_a_native_llama(tie, tmp_path):
    export_checkpoint(random_checkpoint(tmp_path / "run", "tfpp", f"model.tie_embeddings={tie}"), tmp_path / "out")
    assert "auto_map" not in json.loads((tmp_path / "out" / "config.json").read_text())
    ours, theirs, tokens = _ours_and_theirs(tmp_path / "out")  # no remote code
    assert type(theirs).__name__ == "LlamaForCausalLM"
    difference = max_difference(logits_of(theirs, tokens), logits_of(ours, tokens))
    print(f"tfpp (tied={tie}) vs transformers Llama: largest |logit difference| {difference:.3g}")
    assert difference <= 1e-4
    _same_generation(ours, theirs, tokens)


@pytest.mark.parametrize("kind", ["fs", "argrc"])
def test_other_kinds_load_through_their_modeling_file(kind, tmp_path):
    export_checkpoint(random_checkpoint(tmp_path / "run", kind, "model.tie_embeddings=true"), tmp_path / f"{kind}_out")
    ours, theirs, tokens = _ours_and_theirs(tmp_path / f"{kind}_out", trust_remote_code=True)
    assert type(theirs).__name__ == "FSFrameworkForCausalLM"
    assert theirs.model.lm_head.weight is theirs.model.embed.weight  # tied back after loading
    difference = max_difference(logits_of(theirs, tokens), logits_of(ours, tokens))
    print(f"{kind} vs transformers remote code: largest |logit difference| {difference:.3g}")
    assert difference <= 1e-4
    _same_generation(ours, theirs, tokens)


def _llama_dir(tmp_path, **config):
    fields = dict(vocab_size=260, hidden_size=32, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False)
    fields.update(config)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "llama", safe_serialization=True)
    return tmp_path / "llama"


@pytest.mark.parametrize("tie", [False, True])
def test_import_of_a_llama_checkpoint(tie, tmp_path):
    from typer.testing import CliRunner

    from fsframework.cli import app

    hf_dir = _llama_dir(tmp_path, tie_word_embeddings=tie)
    res = CliRunner().invoke(app, ["import", str(hf_dir), str(tmp_path / "imported")])
    assert res.exit_code == 0, res.output
    difference = float(res.output.split("transformers Llama vs imported tfpp: ")[1].split()[0])
    print(f"transformers Llama (tied={tie}) vs imported tfpp: largest |logit difference| {difference:.3g}")
    assert difference <= 1e-4
    cfg = Checkpoint.open(tmp_path / "imported").config()
    assert (cfg.model.name, cfg.model.norm_eps, cfg.model.attention.rope_theta, cfg.model.mlp_hidden,
            cfg.model.tie_embeddings) == ("tfpp", 1e-5, 500000.0, 96, tie)
    # and back: the export of the imported model holds the same tensors under the same names
    export_checkpoint(tmp_path / "imported", tmp_path / "again")
    original, again = load_file(hf_dir / "model.safetensors"), load_file(tmp_path / "again" / "model.safetensors")
    assert original.keys() == again.keys() and all(torch.equal(original[k], again[k]) for k in original)


def test_import_refuses_what_tfpp_cannot_express(tmp_path):
    hf_dir = _llama_dir(tmp_path, num_key_value_heads=1)
    with pytest.raises(ExportError, match="num_key_value_heads=1"):
        import_llama(hf_dir, tmp_path / "imported")
    from typer.testing import CliRunner

    from fsframework.cli import app

    res = CliRunner().invoke(app, ["import", str(hf_dir), str(tmp_path / "imported")])
    assert res.exit_code == 2 and "grouped-query attention" in res.output
    pickled = _llama_dir(tmp_path / "pickled")
    (pickled / "model.safetensors").unlink()
    (pickled / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ExportError, match="pytorch_model.bin are pickle files, which are not read"):
        import_llama(pickled, tmp_path / "imported")
