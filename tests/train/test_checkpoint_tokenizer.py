"""A file tokenizer is saved in every checkpoint, so a checkpoint evaluates anywhere."""

from __future__ import annotations

import pytest

from fsframework.checkpoints import CheckpointError, checkpoint_tokenizer
from fsframework.checkpoints.writing import read_tokenizer, save_tokenizer
from fsframework.data.tokenizers import load_tokenizer, train_bpe_tokenizer


def test_a_file_tokenizer_is_copied_and_preferred_over_the_configured_path(tmp_path):
    source = tmp_path / "work" / "tok.json"
    trained = train_bpe_tokenizer(["the passkey is 12345. " * 50, "hello world " * 50], 300, source)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_tokenizer(read_tokenizer(str(source)), ckpt)
    source.unlink()  # the training run's file is gone (another machine, another working directory)
    spec = checkpoint_tokenizer(ckpt, str(source))
    assert spec == str(ckpt / "tokenizer.json")
    assert load_tokenizer(spec).encode("the passkey is 12345.") == trained.encode("the passkey is 12345.")


def test_byte_tokenizer_needs_no_file_and_old_checkpoints_fall_back_to_the_config(tmp_path):
    save_tokenizer(read_tokenizer("byte"), tmp_path)
    assert list(tmp_path.iterdir()) == []
    assert checkpoint_tokenizer(tmp_path, "byte") == "byte"
    assert checkpoint_tokenizer(tmp_path, "data_cache/tok.json") == "data_cache/tok.json"


def test_a_missing_tokenizer_file_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="missing.json"):
        read_tokenizer(str(tmp_path / "missing.json"))
