"""RULER's aggregation tasks: common words extraction (`cwe`) and frequent words extraction
(`fwe`) (RULER `common_words_extraction.py`, `freq_words_extraction.py`; docs/evaluation.md §4.1).

cwe: a numbered list "1. word 2. word ..." of real English words (wonderwords' noun,
adjective and verb lists, as RULER draws them) where 10 words appear `common` times and the
others `rare` times, shuffled; asked for the 10 most common words; 120 generated tokens;
`string_match_all`. RULER's counts depend on the length: below 4,096 tokens 6 / 1 in the task
and 3 / 1 in its one-shot example of 20 words, from 4,096 on 30 / 3 and 10 / 3 with 40 words.
The one-shot example (its list, question and the 10 words as "1. a 2. b ...") precedes the
task when the length has room for it beside the task's 10 common words (else the sample is
zero-shot, `meta["one_shot"]` False: a departure that lets byte-level models run cwe at 2k).
As many words as fill the length are drawn.

fwe: a coded text of 6-letter random words drawn with Zipf counts `int(n k^-alpha / zeta(alpha))`
over a vocabulary of `(length - 50) // 50` coded words (alpha 2.0), the most frequent
replaced by the noise "..."; asked for the three most frequent coded words (ranks 2-4); 50
generated tokens; `string_match_all`. RULER's fwe has no one-shot example.

Where this differs from RULER: the word list keeps the lists' lowercase, letters-only words
(RULER also keeps e.g. "ATM" and multi-word entries), and when a length needs more words than
the lists hold (~7,000 at 16k+ tokens of a subword tokenizer) the lowercase words of the
standard library's documentation follow (RULER: its own English word list). The list and the
coded text are built just longer than the room and cut at their start, so a prompt is exactly
`length - gen_tokens` tokens (RULER fits whole items under the length); a draw whose answer
words would not stay strictly the most frequent after the cut is redrawn.
"""

from __future__ import annotations

import math
import random
import re
import string
from collections import Counter
from functools import lru_cache
from importlib import resources

from fsframework.data.templates import CWE_TEMPLATE, FWE_TEMPLATE
from fsframework.eval.prompts import PromptTooLong, Sample, _prose_sentences, cut_start

CWE_GEN_TOKENS = 120
FWE_GEN_TOKENS = 50
CWE_COMMON_WORDS = 10
CWE_LONG_FROM = 4096  # RULER's switch to the 30 / 3 counts (`max_seq_length < 4096`)
FWE_ALPHA = 2.0
FWE_WORD_LETTERS = 6
FWE_WORDS_PER_VOCAB = 50  # RULER: vocab_size = max_seq_length // 50, after it subtracts the 50 generated tokens
_REDRAWS = 20


@lru_cache(maxsize=1)
def word_list() -> tuple[str, ...]:
    """wonderwords' nouns, adjectives and verbs (RULER's cwe words), lowercase letters only, sorted."""
    assets = resources.files("wonderwords.assets")
    found = set()
    for name in ("nounlist.txt", "adjectivelist.txt", "verblist.txt"):
        found.update(w.strip() for w in assets.joinpath(name).read_text().splitlines())
    return tuple(sorted(w for w in found if re.fullmatch(r"[a-z]+", w)))


@lru_cache(maxsize=1)
def long_word_list() -> tuple[str, ...]:
    """`word_list()` and then the standard library documentation's other lowercase words: what a
    length draws from when it needs more words than the lists hold (RULER: its English word list)."""
    listed = word_list()
    prose = {w for s in _prose_sentences(2_000_000) for w in re.findall(r"\b[a-z]{3,}\b", s)}
    return listed + tuple(sorted(prose - set(listed)))


def cwe_counts(length: int) -> tuple[tuple[int, int, int], tuple[int, int]]:
    """((one-shot words, common, rare), (task common, task rare)) at `length`, as RULER sets them."""
    if length < CWE_LONG_FROM:
        return (20, 3, 1), (6, 1)
    return (40, 10, 3), (30, 3)


def _word_units(tokenizer, words: list[str]) -> list[list[int]]:
    """Numbered list items, each its own unit: "1. a", " 2. b", ..."""
    return [tokenizer.encode(("" if i == 0 else " ") + f"{i + 1}. {w}") for i, w in enumerate(words)]


def _cwe_list(rng: random.Random, num_words: int, common: int, rare: int) -> tuple[list[str], list[str]]:
    words = word_list() if num_words <= len(word_list()) else long_word_list()
    if num_words > len(words):
        raise PromptTooLong(f"cwe needs {num_words} distinct words at this length; the word list holds {len(words)}")
    drawn = rng.sample(words, num_words)
    items = drawn[:CWE_COMMON_WORDS] * common + drawn[CWE_COMMON_WORDS:] * rare
    rng.shuffle(items)
    return items, drawn[:CWE_COMMON_WORDS]


def _cwe_one_shot(rng: random.Random, length: int) -> str:
    (num_words, common, rare), _ = cwe_counts(length)
    items, answer = _cwe_list(rng, num_words, common, rare)
    context = " ".join(f"{i + 1}. {w}" for i, w in enumerate(items))
    return CWE_TEMPLATE.format(context=context) + " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(answer)) + "\n"


def _fill(build, room: int, start: int):
    """`build(n)` -> (units, payload) for the smallest word count n whose units reach `room`
    tokens, by doubling from the estimate `start`, then bisection."""
    lo, hi = 0, max(start, 1)
    best = build(hi)
    while sum(map(len, best[0])) < room:
        lo, hi = hi, hi * 2
        best = build(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        trial = build(mid)
        if sum(map(len, trial[0])) >= room:
            hi, best = mid, trial
        else:
            lo = mid
    return best


def _strictly_top(counts: Counter, answers: list[str]) -> bool:
    rest = [c for w, c in counts.items() if w not in answers]
    return min(counts[a] for a in answers) > max(rest, default=0)


def cwe_samples(tokenizer, length: int, num_samples: int, seed: int, *, gen_tokens: int = CWE_GEN_TOKENS
                ) -> list[Sample]:
    """`num_samples` common-words prompts of exactly `length - gen_tokens` tokens; `answers` are
    the 10 common words."""
    rng = random.Random(f"{seed}:cwe:{length}")
    _, (common, rare) = cwe_counts(length)
    head_text, tail_text = CWE_TEMPLATE.split("{context}")
    tail = tokenizer.encode(tail_text)
    out = []
    for i in range(num_samples):
        too_long = None
        for _ in range(_REDRAWS):
            draw_seed, one_shot = rng.random(), _cwe_one_shot(rng, length)

            def build(n: int):  # the same draw for every count tried
                items, answer = _cwe_list(random.Random(draw_seed), CWE_COMMON_WORDS + n, common, rare)
                return _word_units(tokenizer, items), (items, answer)

            # the one-shot example when there is room for it beside the common words alone, else none
            least = sum(map(len, build(0)[0]))
            head = tokenizer.encode(one_shot + head_text)
            with_example = len(head) + len(tail) + least <= length - gen_tokens
            if not with_example:
                head = tokenizer.encode(head_text)
            room = length - gen_tokens - len(head) - len(tail)
            if least > room:  # these 10 words are too long: another draw may fit
                too_long = (f"cwe needs {len(head) + len(tail) + least} tokens for its template and "
                            f"{CWE_COMMON_WORDS} words x {common} but only {length - gen_tokens} are available")
                continue
            units, (items, answer) = _fill(build, room, max(1, room // 8 // max(1, rare)))
            ids, cut = cut_start(units, room)
            kept = items[_first_whole(units, cut):]
            if _strictly_top(Counter(kept), answer):
                break
        else:
            raise PromptTooLong(too_long or f"cwe at {length}: no list kept its 10 common words the most frequent")
        prompt = head + ids + tail
        out.append(Sample(prompt, list(answer), {
            "task": "cwe", "length": length, "index": i, "items": len(kept), "common": common, "rare": rare,
            "one_shot": with_example,
            "prompt_tokens": len(prompt)}))
    return out


def _first_whole(units: list[list[int]], cut: int) -> int:
    """Index of the first unit the cut left whole."""
    pos = 0
    for j, unit in enumerate(units):
        if pos >= cut:
            return j
        pos += len(unit)
    return len(units)


def zeta(alpha: float) -> float:
    """Riemann zeta at alpha > 1 (Euler-Maclaurin after 10 terms; scipy's `zeta` to ~1e-9)."""
    n = 10
    head = sum(k ** -alpha for k in range(1, n))
    return head + n ** (1 - alpha) / (alpha - 1) + 0.5 * n ** -alpha + alpha * n ** (-alpha - 1) / 12


def fwe_counts(num_words: int, vocab_size: int, alpha: float = FWE_ALPHA) -> list[int]:
    """RULER's Zipf counts of the vocabulary's ranks 1..vocab_size for `num_words` words."""
    z = zeta(alpha)
    return [int(num_words * k ** -alpha / z) for k in range(1, vocab_size + 1)]


def _coded_vocab(rng: random.Random, size: int) -> list[str]:
    vocab: set[str] = set()
    while len(vocab) < size:
        vocab.add("".join(rng.choices(string.ascii_lowercase, k=FWE_WORD_LETTERS)))
    ordered = sorted(vocab)
    rng.shuffle(ordered)
    ordered[0] = "..."  # RULER: the most frequent word is noise
    return ordered


def fwe_samples(tokenizer, length: int, num_samples: int, seed: int, *, gen_tokens: int = FWE_GEN_TOKENS,
                alpha: float = FWE_ALPHA) -> list[Sample]:
    """`num_samples` frequent-words prompts of exactly `length - gen_tokens` tokens; `answers` are
    the coded words of ranks 2-4."""
    rng = random.Random(f"{seed}:fwe:{length}")
    vocab_size = (length - gen_tokens) // FWE_WORDS_PER_VOCAB
    head_text, tail_text = FWE_TEMPLATE.split("{context}")
    head, tail = tokenizer.encode(head_text), tokenizer.encode(tail_text)
    room = length - gen_tokens - len(head) - len(tail)
    if vocab_size < 5 or room <= 0:
        raise PromptTooLong(f"fwe needs at least 5 coded words (one per {FWE_WORDS_PER_VOCAB} tokens) and room after "
                            f"its {len(head) + len(tail)}-token template; {length - gen_tokens} tokens give "
                            f"{vocab_size} words and {room} tokens of room")
    out = []
    for i in range(num_samples):
        for _ in range(_REDRAWS):
            vocab = _coded_vocab(rng, vocab_size)
            order_seed = rng.random()

            def build(n: int):
                words = [w for w, c in zip(vocab, fwe_counts(n, vocab_size, alpha)) for _ in range(c)]
                random.Random(order_seed).shuffle(words)
                return [tokenizer.encode(("" if j == 0 else " ") + w) for j, w in enumerate(words)], words

            units, words = _fill(build, room, max(1, room // (FWE_WORD_LETTERS + 1)))
            ids, cut = cut_start(units, room)
            kept = Counter(w for w in words[_first_whole(units, cut):] if w != "...")
            answer = vocab[1:4]
            if all(kept[a] for a in answer) and _strictly_top(kept, answer):
                break
        else:
            raise PromptTooLong(f"fwe at {length}: {room} tokens of coded text do not rank three words above the rest")
        prompt = head + ids + tail
        out.append(Sample(prompt, list(answer), {
            "task": "fwe", "length": length, "index": i, "vocab_size": vocab_size,
            "answer_counts": [kept[a] for a in answer], "prompt_tokens": len(prompt)}))
    return out
