"""Tokenizers: byte-level (default, no files), HF `tokenizer.json`, sentencepiece `.model`.

All expose `encode(text) -> list[int]`, `decode(ids) -> str`, `vocab_size` and
`eos_id` (the document separator appended after every document).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, Sequence


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes 0..255, then EOS = 256. Vocab 257 (models round it up)."""

    name = "byte"
    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A Hugging Face `tokenizers` JSON file."""

    def __init__(self, path: str):
        from tokenizers import Tokenizer as _Tok

        self.name = path
        self._tok = _Tok.from_file(path)
        self.vocab_size = self._tok.get_vocab_size()
        eos = None
        for cand in ("</s>", "<|endoftext|>", "<eos>", "[SEP]"):
            eos = self._tok.token_to_id(cand)
            if eos is not None:
                break
        self.eos_id = eos if eos is not None else self.vocab_size - 1

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids])


class SentencePieceTokenizer:
    def __init__(self, path: str):
        import sentencepiece as spm

        self.name = path
        self._sp = spm.SentencePieceProcessor(model_file=path)
        self.vocab_size = self._sp.get_piece_size()
        eos = self._sp.eos_id()
        self.eos_id = eos if eos >= 0 else self.vocab_size - 1

    def encode(self, text: str) -> list[int]:
        return list(self._sp.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.decode([int(i) for i in ids])


def load_tokenizer(spec: str) -> Tokenizer:
    """`byte`, a path to `tokenizer.json`, or a path to a sentencepiece `.model`."""
    if spec == "byte":
        return ByteTokenizer()
    path = Path(spec)
    if not path.is_file():
        problem = "is a directory" if path.is_dir() else "tokenizer file not found"
        raise FileNotFoundError(f"{problem}: {spec} (use 'byte', a tokenizer.json or a .model file)")
    kinds = {".json": HFTokenizer, ".model": SentencePieceTokenizer}
    if path.suffix in kinds:
        try:
            return kinds[path.suffix](str(path))
        except Exception as exc:  # the libraries' parse errors name neither the file nor the kind expected
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"tokenizer file {spec} is not a readable {path.suffix} tokenizer: {first}") from None
    raise ValueError(f"unknown tokenizer file type {path.suffix!r} for {spec}: expected .json or .model")


def train_bpe_tokenizer(texts, vocab_size: int, out_path: str | Path) -> HFTokenizer:
    """Train a byte-level BPE `tokenizer.json` (EOS `</s>`) on an iterable of texts.

    Byte-level, so any text encodes; numbers get multi-digit pieces from the data
    (random numbers in the training text teach all two-digit merges), which lets a
    small model copy a number in a few pieces instead of digit by digit.
    Written atomically (temporary file, then rename).
    """
    from tokenizers import Tokenizer as _Tok
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if vocab_size < 300:
        raise ValueError(f"vocab_size must be >= 300 (256 bytes, EOS and merges), got {vocab_size}")
    tok = _Tok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    tok.save(str(tmp))
    tmp.replace(out_path)
    return HFTokenizer(str(out_path))


def tokenizer_identity(tok: Tokenizer) -> dict:
    """What a dataset built with `tok` records of it (`build.json`), so training and evaluation can
    tell a different tokenizer from the same file at another path: vocabulary size, EOS and, for a
    file, the SHA-256 of its bytes."""
    import hashlib

    digest = None if tok.name == "byte" else hashlib.sha256(Path(tok.name).read_bytes()).hexdigest()
    return {"name": tok.name, "vocab_size": tok.vocab_size, "eos_id": tok.eos_id, "sha256": digest}
