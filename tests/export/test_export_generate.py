"""Exports as standard transformers code uses them: `AutoTokenizer` reads complete tokenizer files
(special tokens, no token_type_ids), config.json and generation_config.json name EOS and the pad
token, and `model.generate(**tok(text, return_tensors="pt"))` decodes as fsframework does."""

from __future__ import annotations

import json

import pytest
import torch

from fsframework.checkpoints import load_model
from fsframework.eval.decoding import greedy_generate
from fsframework.export import export_checkpoint
from fsframework.models.registry import KINDS
from tests.export.helpers import random_checkpoint

transformers = pytest.importorskip("transformers")  # a dev dependency (pyproject.toml)

TRAINABLE = [name for name, kind in KINDS.items() if kind.trainable]


def _generate_as_transformers_code_does(out, kind):
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32,
                                                              trust_remote_code=kind != "tfpp").eval()
    inputs = tok("Grüße, hello", return_tensors="pt")
    assert set(inputs) == {"input_ids", "attention_mask"}
    generated = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    return tok, inputs["input_ids"], generated


@pytest.mark.parametrize("kind", TRAINABLE)
def test_generate_with_the_exported_byte_tokenizer(kind, tmp_path):
    out = tmp_path / "out"
    export_checkpoint(random_checkpoint(tmp_path / "run", kind), out)
    config = json.loads((out / "config.json").read_text())
    assert config["eos_token_id"] == 256 and config["pad_token_id"] == 256
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 256 and generation["pad_token_id"] == 256
    tok, prompt, generated = _generate_as_transformers_code_does(out, kind)
    assert prompt[0].tolist() == list("Grüße, hello".encode("utf-8"))  # byte b is token b, as in training
    assert tok.eos_token_id == 256 and tok.pad_token_id == 256 and tok.decode([72, 105]) == "Hi"
    ours, _ = load_model(out)
    new = generated[0, prompt.shape[1]:].tolist()
    assert new
    assert new == greedy_generate(ours, [prompt[0].tolist()], 5)[0][:len(new)]


def test_generate_with_an_exported_file_tokenizer(tmp_path):
    from fsframework.data.tokenizers import load_tokenizer, train_bpe_tokenizer

    train_bpe_tokenizer(["hello world, hello export, Grüße"] * 20, 300, tmp_path / "tok.json")
    run = random_checkpoint(tmp_path / "run", "fs", f"data.tokenizer={tmp_path / 'tok.json'}", "model.vocab_size=300")
    export_checkpoint(run, tmp_path / "out")
    eos = load_tokenizer(str(tmp_path / "tok.json")).eos_id
    assert json.loads((tmp_path / "out" / "config.json").read_text())["eos_token_id"] == eos
    tok, prompt, generated = _generate_as_transformers_code_does(tmp_path / "out", "fs")
    assert tok.eos_token == "</s>" and tok.pad_token_id == eos
    assert prompt[0].tolist() == load_tokenizer(str(tmp_path / "tok.json")).encode("Grüße, hello")
    assert generated.shape[1] > prompt.shape[1]


@pytest.mark.parametrize("model_type, byte_fallback", [("bpe", True), ("unigram", False)])
def test_generate_with_an_exported_sentencepiece_tokenizer(model_type, byte_fallback, tmp_path):
    """A sentencepiece run's export carries a tokenizer.json of the same pieces: transformers
    encodes as sentencepiece does (unknown characters as their bytes, under byte fallback)."""
    import sentencepiece as spm

    from fsframework.data.stdlib_text import stdlib_prose
    from fsframework.data.tokenizers import load_tokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(stdlib_prose(60_000)))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=600,
                                   model_type=model_type, byte_fallback=byte_fallback, minloglevel=2)
    run = random_checkpoint(tmp_path / "run", "fs", f"data.tokenizer={tmp_path / 'sp.model'}", "model.vocab_size=600")
    export_checkpoint(run, tmp_path / "out")
    ours = load_tokenizer(str(tmp_path / "sp.model"))
    assert (tmp_path / "out" / "tokenizer.model").is_file()  # what fsframework reads back
    tok, prompt, generated = _generate_as_transformers_code_does(tmp_path / "out", "fs")
    assert tok.eos_token_id == ours.eos_id and tok.pad_token_id == ours.eos_id
    assert json.loads((tmp_path / "out" / "generation_config.json").read_text())["eos_token_id"] == ours.eos_id
    texts = ["The object's  value is   returned.\nSee the module docs.", " leading and trailing  "]
    if byte_fallback:  # else an unknown character is <unk> in both, which sentencepiece decodes as " ⁇ "
        texts.append("Grüße ☃, hello")
    for text in texts:
        assert tok(text)["input_ids"] == ours.encode(text), text
        assert tok.decode(ours.encode(text)) == ours.decode(ours.encode(text)), text
    assert prompt[0].tolist() == ours.encode("Grüße, hello") and generated.shape[1] > prompt.shape[1]
