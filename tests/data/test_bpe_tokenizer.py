"""`fsf data tokenizer` trains a byte-level BPE tokenizer.json that the loader and models use."""

from __future__ import annotations

import pytest

from fsframework.data.tokenizers import load_tokenizer, train_bpe_tokenizer
from tests.utils import run_fsf


def test_trained_bpe_round_trips_and_merges_digits(tmp_path):
    texts = [f"The passkey is {n}. Remember it." for n in range(10_000, 30_000, 7)] * 2
    tok = train_bpe_tokenizer(texts, 400, tmp_path / "tok.json")
    assert tok.vocab_size == 400 and tok.decode([tok.eos_id]) == "" and tok.eos_id == 0
    text = "The passkey is 84606. Ünïcode and\ttabs survive"
    assert tok.decode(tok.encode(text)) == text
    pieces = [tok.decode([i]) for i in tok.encode(" 84606")]
    assert len(pieces) < 6 and "".join(pieces) == " 84606"  # fewer pieces than digits
    assert load_tokenizer(str(tmp_path / "tok.json")).encode(text) == tok.encode(text)
    assert not (tmp_path / "tok.json.tmp").exists()


def test_vocab_too_small_is_refused(tmp_path):
    with pytest.raises(ValueError, match="vocab_size must be >= 300"):
        train_bpe_tokenizer(["abc"], 100, tmp_path / "tok.json")


def test_cli_trains_on_files_and_names_missing_ones(tmp_path):
    src = tmp_path / "a.txt"
    src.write_text("hello world, the quick brown fox 12345 " * 200)
    out = tmp_path / "bpe" / "tokenizer.json"
    proc = run_fsf("data", "tokenizer", str(out), "--vocab-size", "320", "--input", str(src))
    # a small text runs out of merges before 320: the vocabulary is what the data supports
    assert f"vocab {load_tokenizer(str(out)).vocab_size}" in proc.stdout and proc.stdout.startswith(f"wrote {out}")
    bad = run_fsf("data", "tokenizer", str(tmp_path / "new.json"), "--input", str(tmp_path / "missing.txt"), check=False)
    assert bad.returncode == 2 and "missing.txt" in bad.stderr
    again = run_fsf("data", "tokenizer", str(out), "--input", str(src), check=False)  # datasets record its hash
    assert again.returncode == 2 and f"{out}: exists" in again.stderr
