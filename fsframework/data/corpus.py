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
from fsframework.data.tokenizers import tokenizer_identity


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


# written last into a build: a directory holding it is complete
RECIPE = "recipe.json"

# Bumped whenever the build writes other shards from the same settings (document order, packing,
# the retrieval documents' text, the split), so an older cache is never taken for a current one.
FORMAT_VERSION = 8


def embedded_recipe(tokenizer, seq_len: int, *, python_chars: int, retrieval_docs: int, eval_fraction: float,
                    seed: int = 0, retrieval_max_fraction: float = 1.5) -> dict:
    """Everything the shards of one build depend on: the settings, the tokenizer's contents (not its
    path: the same file elsewhere builds the same shards), the Python whose standard library gives
    the text, and the format version."""
    import platform

    identity = tokenizer_identity(tokenizer)
    return {"tokenizer": {key: identity[key] for key in ("vocab_size", "eos_id", "sha256")},
            "seq_len": seq_len, "python_chars": python_chars, "retrieval_docs": retrieval_docs,
            "retrieval_max_fraction": retrieval_max_fraction, "eval_fraction": eval_fraction, "seed": seed,
            "python": f"{platform.python_implementation()} {platform.python_version()}",
            "version": FORMAT_VERSION}


def embedded_corpus_dir(cache_dir: str | Path, recipe: dict) -> Path:
    """The directory of the build of `recipe` under `cache_dir`: `seq<seq_len>-<hash>`, the hash of the
    whole recipe, so builds of other settings (another length, tokenizer, size) sit side by side
    and none is ever rewritten in place."""
    import hashlib

    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:8]
    return Path(cache_dir) / f"seq{recipe['seq_len']}-{digest}"


def build_embedded_corpus(cache_dir: str | Path, tokenizer, seq_len: int, *, python_chars: int,
                          retrieval_docs: int, eval_fraction: float, seed: int = 0,
                          retrieval_max_fraction: float = 1.5) -> Path:
    """Build the `train` and `eval` MDS datasets of these settings under `cache_dir` (once: an existing
    build is used as it is) and return their directory (`embedded_corpus_dir`).

    The build is written to a temporary directory beside it, renamed into place only when complete:
    a crashed build leaves no half-written corpus at the name readers look at, and of two builds
    racing, the second to finish finds the first one's in place and uses it."""
    import os
    import secrets
    import shutil

    from fsframework.data.partial_builds import clean_partial_builds, partial_build_dir  # with the shards' imports
    from fsframework.data.shards import pack_documents, write_mds  # numpy: `fsf data` imports this module at start-up

    recipe = embedded_recipe(tokenizer, seq_len, python_chars=python_chars, retrieval_docs=retrieval_docs,
                             eval_fraction=eval_fraction, seed=seed, retrieval_max_fraction=retrieval_max_fraction)
    out_dir = embedded_corpus_dir(cache_dir, recipe)
    # Shards written straight into `cache_dir` (the layout before keyed builds) are left alone and
    # never read: the corpus is rebuilt under its keyed directory.
    if (out_dir / RECIPE).is_file():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    clean_partial_builds(out_dir)  # what killed builds of this corpus left on this host
    tmp = partial_build_dir(out_dir, secrets.token_hex(4))
    tmp.mkdir()
    try:
        # retrieval documents are `retrieval_max_fraction / 2 .. retrieval_max_fraction` x seq_len characters
        docs = embedded_documents(python_chars, retrieval_docs, doc_chars=int(seq_len * retrieval_max_fraction),
                                  seed=seed, tokenizer=tokenizer)
        eval_docs, train_docs = _split_heldout(docs, eval_fraction, min_chars=64 * seq_len)
        stats = {}
        for split, split_docs in (("train", train_docs), ("eval", eval_docs)):
            if not split_docs:
                continue
            samples = pack_documents((tokenizer.encode(d) for d in split_docs), seq_len, tokenizer.eos_id)
            stats[split] = write_mds(samples, tmp / split)
        (tmp / RECIPE).write_text(json.dumps({"recipe": recipe, "stats": stats}, indent=1))
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if not (out_dir / RECIPE).is_file():
                raise
            # another build of the same settings finished first: its corpus is the same, use it
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
