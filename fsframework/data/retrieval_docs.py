"""Generated retrieval documents of the embedded corpus: a fact planted in filler text,
asked for later, in the prompt formats of the evaluation tasks.

Why the evaluation's formats: a model of a few million parameters trained on a few
million tokens of plain text does not learn to copy from context at all (measured:
TF++ and FS at 0.92M parameters answered every passkey with a constant number after
8M tokens). The papers' models learn retrieval from web-scale text; at the scale of
a CPU replication, documents shaped like the tasks teach the skill in a budget of
minutes. Only the formats are shared with the evaluation (`fsframework.data.templates`
holds them for both): keys are random pairs of words from the corpus's own prose (the
evaluation draws adjective-noun keys from its own lists), values are random numbers,
and the filler is the corpus's prose or the evaluation's noise sentences.

Four shapes, chosen at random (repeat half of the time, the others a sixth each):
- passkey: the passkey prompt (as `fsframework.eval.passkey` asks it) followed by the answer;
- one fact: a RULER NIAH prompt (as `fsframework.eval.ruler` asks it) with one needle, answered;
- several facts (2-4 needles), every one of them asked and answered in turn, so a
  document holds several answers to copy;
- repeat: passages (prose, random words or random numbers), each followed by itself
  again. Every token of a second copy is predictable only by copying, so these
  documents carry most of the signal that makes induction (copying) heads form: the
  answers of the other shapes are a few tokens per document. (Measured: TF++ with the
  first three shapes alone still answered passkeys with a constant after 2M tokens.)
"""

from __future__ import annotations

import random
import re

from fsframework.data.templates import (NIAH_NEEDLE, NIAH_NOISE, NIAH_TEMPLATE, PASSKEY_HEAD, PASSKEY_NEEDLE,
                                        PASSKEY_TAIL)


def key_words(prose: list[str], limit: int = 4000, tokenizer=None, min_single: int = 200) -> list[str]:
    """Distinct lowercase words (3-10 letters) of the prose, in first-seen order.

    With a `tokenizer`, only the words that encode (after a space) as ONE token are kept,
    when there are at least `min_single` of them (never for the byte tokenizer): a passage of
    random single-token words is then a sequence of random tokens, where copying is the
    only way to predict the repeat and no piece of a word is ambiguous; that is the signal
    on which copying heads form fastest."""
    seen: dict[str, None] = {}
    for doc in prose:
        for word in re.findall(r"\b[a-z]{3,10}\b", doc):
            seen.setdefault(word, None)
        if len(seen) >= limit:
            break
    words = list(seen)[:limit]
    if tokenizer is not None:
        single = [w for w in words if len(tokenizer.encode(" " + w)) == 1]
        if len(single) >= min_single:
            return single
    return words


def filler_text(prose: list[str], rng: random.Random, num_chars: int) -> str:
    """Natural-text filler of about `num_chars` characters from random prose paragraphs."""
    parts, total = [], 0
    while total < num_chars:
        doc = prose[rng.randrange(len(prose))]
        start = rng.randrange(max(1, len(doc) - 400))
        piece = doc[start:start + rng.randint(200, 1200)]
        parts.append(piece)
        total += len(piece) + 1
    return " ".join(parts)[:num_chars]


def noise_text(num_chars: int) -> str:
    """The RULER noise haystack (one repeated paragraph), cut to `num_chars`."""
    return ((NIAH_NOISE + " ") * (num_chars // (len(NIAH_NOISE) + 1) + 1))[:num_chars]


def _plant(filler: str, needles: list[str], rng: random.Random) -> str:
    """Insert `needles` at random word boundaries of `filler`, in the given order."""
    cuts = sorted(rng.randrange(len(filler) + 1) for _ in needles)
    pieces, prev = [], 0
    for cut, needle in zip(cuts, needles):
        space = filler.find(" ", cut)
        cut = len(filler) if space < 0 else max(space, prev)
        pieces += [filler[prev:cut], " " + needle]
        prev = cut
    pieces.append(filler[prev:])
    return "".join(pieces)


PASSAGE_KINDS = ("prose", "words", "numbers")


def random_passage(prose: list[str], words: list[str], rng: random.Random, size: int, kind: str | None = None) -> str:
    """About `size` characters of prose, random words or random numbers (`kind`, default random)."""
    # random words half of the time: the cleanest copying signal (see `key_words`)
    kind = PASSAGE_KINDS.index(kind) if kind is not None else (0, 1, 1, 2)[rng.randrange(4)]
    if kind == 0:
        return filler_text(prose, rng, size)
    items, total = [], 0
    while total < size:
        items.append(rng.choice(words) if kind == 1 else str(rng.randint(1_000, 9_999_999)))
        total += len(items[-1]) + 2
    return (" " if kind == 1 else ", ").join(items) + "."


# the lines around a repeated passage (public: a copy probe can build its prompts from them too)
REPEAT_INTRO = "Read this carefully.\n"
REPEAT_AGAIN = "\nNow the same text again.\n"


def repeat_document(prose: list[str], words: list[str], rng: random.Random, length_chars: int) -> str:
    """Passages, each followed by itself again, until about `length_chars` characters.

    A passage is prose, random words or random numbers (the last two only copying can
    predict), of 20 characters up to a third of the document, so copy distances range
    from a few tokens (easy to discover) to most of a training sequence."""
    parts, total = [], 0
    while total < length_chars * 2 // 3:
        passage = random_passage(prose, words, rng, rng.randint(20, max(20, length_chars // 3)))
        parts.append(REPEAT_INTRO + passage + REPEAT_AGAIN + passage)
        total += 2 * len(passage) + 45  # about the two marker lines (kept: it fixes the corpus)
    return "\n".join(parts)


def retrieval_document(prose: list[str], words: list[str], rng: random.Random, length_chars: int) -> str:
    """One document of about `length_chars` characters (longer when its template needs it)."""
    if rng.random() < 0.5:
        return repeat_document(prose, words, rng, length_chars)
    kind = rng.choice(("passkey", "fact", "facts"))
    if kind == "passkey":
        key = str(rng.randint(10_000, 99_999))
        needle = PASSKEY_NEEDLE.format(key=key)
        body = max(length_chars - len(PASSKEY_HEAD) - len(PASSKEY_TAIL) - len(needle), 40)
        return PASSKEY_HEAD + _plant(filler_text(prose, rng, body), [needle], rng) + PASSKEY_TAIL + f" {key}."
    count = 1 if kind == "fact" else rng.randint(2, 4)
    keys = []
    while len(keys) < count:
        key = f"{rng.choice(words)}-{rng.choice(words)}"
        if key not in keys:
            keys.append(key)
    values = [str(rng.randint(1_000_000, 9_999_999)) for _ in keys]
    needles = [NIAH_NEEDLE.format(type_v="numbers", key=k, value=v) for k, v in zip(keys, values)]
    order = list(range(count))
    rng.shuffle(order)
    questions = [NIAH_TEMPLATE.split("{context}\n", 1)[1].format(type_v="numbers", query=keys[i]) + f" {values[i]}."
                 for i in order]
    head = NIAH_TEMPLATE.split("{context}", 1)[0].format(type_v="numbers")
    fixed = len(head) + sum(map(len, needles)) + sum(map(len, questions)) + count + 1
    body = max(length_chars - fixed, 40)
    filler = noise_text(body) if rng.random() < 0.5 else filler_text(prose, rng, body)
    return head + _plant(filler, needles, rng) + "\n" + "\n".join(questions)
