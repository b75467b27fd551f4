"""The tokenizer files of an export, as transformers' `AutoTokenizer` and `generate()` read them
(docs/export.md): `tokenizer.json` (the run's, or for the byte tokenizer an equivalent one written
here), `tokenizer_config.json` with the special tokens and `model_input_names`, and
`special_tokens_map.json`; `generation_config.json` beside them names EOS and the pad token.

The byte tokenizer (UTF-8 bytes 0..255, EOS 256) is written as a byte-level BPE without merges:
byte b is token id b, so transformers encodes exactly as `fsframework.data.tokenizers` does.
A sentencepiece `.model` is copied (fsframework reads it) and written as a `tokenizer.json` too
(`fsframework.export.sentencepiece_json`), which transformers reads as a fast tokenizer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Optional

from fsframework.checkpoints import TOKENIZER_STEM
from fsframework.data.tokenizers import load_tokenizer
from fsframework.export.sentencepiece_json import write_sentencepiece_json

EOS_TOKEN = "</s>"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, the alphabet of byte-level BPE."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_tokenizer(path: Path) -> None:
    """Write the byte tokenizer as a `tokenizer.json` at `path`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: b for b, char in _bytes_to_unicode().items()}
    vocab[EOS_TOKEN] = 256
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOS_TOKEN, special=True)])
    tok.save(str(path))


def write_tokenizer_files(spec: str, source: Optional[Path], out: Path, max_length: int) -> int:
    """Write the tokenizer files of tokenizer `spec` (its file at `source`) into `out`; returns the
    EOS id, which is also the pad id (an LM pads with the token that ends its documents)."""
    if spec == "byte":
        byte_tokenizer(out / f"{TOKENIZER_STEM}.json")
        eos_id, eos = 256, EOS_TOKEN
    else:
        shutil.copyfile(source, out / f"{TOKENIZER_STEM}{source.suffix}")
        tok = load_tokenizer(str(source))
        eos_id = tok.eos_id
        if source.suffix == ".model":  # kept for fsframework; transformers reads the tokenizer.json beside it
            write_sentencepiece_json(source, out / f"{TOKENIZER_STEM}.json")
            eos = tok._sp.id_to_piece(eos_id)
        else:
            eos = tok._tok.id_to_token(eos_id)
    special = {"eos_token": eos, "pad_token": eos}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **special,
              # no token_type_ids: the models take input_ids and attention_mask only
              "model_input_names": ["input_ids", "attention_mask"], "model_max_length": max_length,
              "padding_side": "left", "clean_up_tokenization_spaces": False}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2))
    return eos_id


def generation_config(eos_id: int) -> dict[str, Any]:
    """generation_config.json: greedy decoding that stops at EOS and pads with it."""
    return {"eos_token_id": eos_id, "pad_token_id": eos_id, "do_sample": False}
