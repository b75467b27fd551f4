"""The embedded default corpus: real text every Python install carries, plus generated
long-range retrieval documents, written as MDS shards.

- Natural text (`fsframework.data.stdlib_text`): docstrings and the reference-manual
  topics shipped inside the standard library (`pydoc_data/topics.py`), and the
  library's source files, found through `sysconfig`, read in sorted order
  (deterministic).
- Retrieval documents (`fsframework.data.retrieval_docs`): facts and passkeys
  planted in filler before the question that asks for them, in the evaluation's
  prompt formats (`fsframework.data.templates`), so small models can learn to retrieve.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from fsframework.data.retrieval_docs import key_words, retrieval_document
from fsframework.data.stdlib_text import stdlib_code, stdlib_prose


def embedded_documents(python_chars: int, retrieval_docs: int, doc_chars: int, seed: int = 0,
                       tokenizer=None) -> list[str]:
    """All documents of the embedded corpus in a deterministic shuffled order (`tokenizer`:
    see `key_words`)."""
    rng = random.Random(seed)
    prose = stdlib_prose(python_chars // 2)
    code = stdlib_code(python_chars // 2)
    words = key_words(prose, tokenizer=tokenizer)
    retrieval = [retrieval_document(prose, words, rng, rng.randint(doc_chars // 2, doc_chars))
                 for _ in range(retrieval_docs)]
    docs = prose + code + retrieval
    rng.shuffle(docs)
    return docs


def _split_heldout(docs: list[str], fraction: float, min_chars: int) -> tuple[list[str], list[str]]:
    """Hold out leading documents until they cover `fraction` of the characters, and at
    least `min_chars` (so perplexity at several times the training length has windows)."""
    if fraction <= 0:
        return [], docs
    target = max(fraction * sum(map(len, docs)), min_chars)
    taken, count = 0, 0
    while count < len(docs) - 1 and taken < target:
        taken += len(docs[count])
        count += 1
    return docs[:count], docs[count:]


def build_embedded_corpus(out_dir: str | Path, tokenizer, seq_len: int, *, python_chars: int,
                          retrieval_docs: int, eval_fraction: float, seed: int = 0,
                          retrieval_max_fraction: float = 1.5) -> dict:
    """Write `out_dir/train` and `out_dir/eval` MDS datasets (skipped when the same build exists)."""
    from fsframework.data.shards import pack_documents, write_mds  # numpy: `fsf data` imports this module at start-up

    out_dir = Path(out_dir)
    recipe = {"tokenizer": tokenizer.name, "seq_len": seq_len, "python_chars": python_chars,
              "retrieval_docs": retrieval_docs, "retrieval_max_fraction": retrieval_max_fraction,
              "eval_fraction": eval_fraction, "seed": seed, "version": 7}
    stamp = out_dir / "recipe.json"
    if stamp.is_file() and json.loads(stamp.read_text()).get("recipe") == recipe:
        return json.loads(stamp.read_text())["stats"]
    import shutil

    if out_dir.exists():
        shutil.rmtree(out_dir)
    # retrieval documents are `retrieval_max_fraction / 2 .. retrieval_max_fraction` x seq_len characters
    docs = embedded_documents(python_chars, retrieval_docs, doc_chars=int(seq_len * retrieval_max_fraction), seed=seed,
                              tokenizer=tokenizer)
    eval_docs, train_docs = _split_heldout(docs, eval_fraction, min_chars=64 * seq_len)
    stats = {}
    for split, split_docs in (("train", train_docs), ("eval", eval_docs)):
        if not split_docs:
            continue
        samples = pack_documents((tokenizer.encode(d) for d in split_docs), seq_len, tokenizer.eos_id)
        stats[split] = write_mds(samples, out_dir / split)
    stamp.write_text(json.dumps({"recipe": recipe, "stats": stats}, indent=1))
    return stats
