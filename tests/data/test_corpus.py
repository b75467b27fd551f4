"""The embedded corpus builds MDS shards that the streaming loader reads back; tokenizers round-trip."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from fsframework.config import load_config
from fsframework.data.corpus import build_embedded_corpus, retrieval_document
from fsframework.data.loader import TokenLoader, make_streaming_dataset, prepare_data_dir
from fsframework.data.shards import pack_documents
from fsframework.data.stdlib_text import stdlib_prose
from fsframework.data.tokenizers import ByteTokenizer, load_tokenizer


def test_pack_documents_keeps_boundaries():
    docs = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11]]
    samples = list(pack_documents(docs, seq_len=4, eos_id=0))
    assert [s["tokens"].tolist() for s in samples] == [[1, 2, 3, 0, 4], [5, 0, 6, 7, 8]]
    assert [s["doc_ids"].tolist() for s in samples] == [[0, 0, 0, 0, 1], [0, 0, 1, 1, 1]]


def test_embedded_corpus_builds_and_loads(tmp_path):
    cfg = load_config(None, [f"data.cache_dir={tmp_path}", "data.seq_len=128", "data.micro_batch_size=3",
                             "data.embedded_python_chars=100000", "data.embedded_retrieval_docs=20"])
    train_dir = prepare_data_dir(cfg, "train")
    root = Path(train_dir).parent
    assert root.parent == tmp_path and re.fullmatch(r"seq128-[0-9a-f]{8}", root.name)
    stats = (root / "recipe.json").read_text()
    assert '"train"' in stats and (root / "eval" / "index.json").is_file()
    mtime = (root / "train" / "index.json").stat().st_mtime
    assert prepare_data_dir(cfg, "train") == train_dir  # same recipe: reused, not rebuilt
    assert (root / "train" / "index.json").stat().st_mtime == mtime

    dataset = make_streaming_dataset(train_dir, batch_size=3, shuffle=False, seed=0)
    loader = TokenLoader(dataset, batch_size=3)
    batch = next(loader)
    loader.close()
    assert batch["inputs"].shape == (3, 128) and batch["targets"].shape == (3, 128)
    assert np.array_equal(batch["inputs"][:, 1:].numpy(), batch["targets"][:, :-1].numpy())
    text = ByteTokenizer().decode(batch["inputs"][0].tolist())
    assert len(text) > 50
    # shards hold real stdlib text and generated retrieval documents
    all_text = "".join(ByteTokenizer().decode(dataset[i]["tokens"].tolist()) for i in range(len(dataset)))
    assert "The passkey is" in all_text or "special magic number" in all_text
    assert "def " in all_text


def test_retrieval_documents_answer_what_they_planted():
    import random

    from fsframework.data.retrieval_docs import key_words, retrieval_document

    prose = stdlib_prose(200_000)
    words = key_words(prose)
    assert len(words) > 500 and all(w.isalpha() and w.islower() for w in words)
    rng = random.Random(3)
    kinds = set()
    for _ in range(60):
        doc = retrieval_document(prose, words, rng, 1500)
        assert 900 <= len(doc) <= 2100
        if doc.startswith("Read this carefully.\n"):
            kinds.add("repeat")
            for part in doc.split("Read this carefully.\n")[1:]:
                first, second = part.split("\nNow the same text again.\n")
                assert second in (first, first + "\n") and len(first) >= 20  # parts are joined by newlines
            continue
        if doc.endswith("."):
            doc = doc[:-1]
        if "passkey" in doc:
            kinds.add("passkey")
            key = doc.rsplit(" ", 1)[-1]
            assert len(key) == 5 and key.isdigit()
            # planted once before the question, asked once at the end
            assert doc.count(f"The passkey is {key}.") == 1
            assert doc.index(f"The passkey is {key}.") < doc.index("What is the passkey?")
            continue
        questions = re.findall(r"What are all the special magic numbers for (\S+) mentioned in the provided text\? "
                               r"The special magic numbers for \1 mentioned in the provided text are (\d{7})", doc)
        kinds.add("fact" if len(questions) == 1 else "facts")
        assert 1 <= len(questions) <= 4 and len({k for k, _ in questions}) == len(questions)
        for key, value in questions:
            needle = f"One of the special magic numbers for {key} is: {value}."
            assert doc.count(needle) == 1 and doc.index(needle) < doc.index("What are all")
    assert kinds == {"passkey", "fact", "facts", "repeat"}


def test_tokenizers_round_trip(tmp_path):
    text = "Hello, wörld! 123"
    byte = load_tokenizer("byte")
    assert byte.decode(byte.encode(text)) == text and byte.eos_id == 256

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE(unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.train_from_iterator([text] * 20, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "</s>"],
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(str(tmp_path / "tokenizer.json"))
    assert tok.eos_id == hf.token_to_id("</s>")
    assert tok.decode(tok.encode("Hello")).strip() == "Hello"

    import sentencepiece as spm

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(stdlib_prose(60_000)))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=200,
                                   model_type="bpe", minloglevel=2)
    sp = load_tokenizer(str(tmp_path / "sp.model"))
    assert sp.decode(sp.encode("the value of the object")) == "the value of the object"

    with pytest.raises(FileNotFoundError, match="tokenizer file not found"):
        load_tokenizer(str(tmp_path / "missing.json"))
