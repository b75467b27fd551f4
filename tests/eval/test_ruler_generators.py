"""RULER's variable tracking (vt), common words (cwe) and frequent words (fwe) generators.

Each sample's answers are re-derived from its decoded prompt text by an independent route
(following the assignments, counting the list's words, counting the coded words) and compared
with `sample.answers`; the templates and scorers are compared with RULER's own text
(NVIDIA RULER `scripts/data/synthetic/constants.py`, `eval/synthetic/constants.py`).
"""

from __future__ import annotations

import math
import re
from collections import Counter

import pytest

from fsframework.data.templates import (CWE_TEMPLATE, FWE_TEMPLATE, NIAH_NOISE, QA_DOCUMENT, QA_TEMPLATE,
                                        VT_TEMPLATE)
from fsframework.data.tokenizers import load_tokenizer
from fsframework.eval.prompts import PromptTooLong
from fsframework.eval.ruler_vt import vt_samples
from fsframework.eval.ruler_words import cwe_counts, cwe_samples, fwe_counts, fwe_samples, word_list, zeta
from fsframework.eval.scoring import (postprocess_pred, sample_match_all, sample_match_part, string_match_all,
                                      string_match_part)

TOK = load_tokenizer("byte")

# RULER's task template + answer prefix, joined as RULER joins them for a base model
RULER_VT = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
            "Question: Find all variables that are assigned the value {query} in the text above."
            + " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
              "assigned the value {query}, they are: ")
RULER_CWE = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
             "ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?"
             + " Answer: The top 10 words that appear most often in the list are:")
RULER_FWE = ("Read the following coded text and track the frequency of each coded word. Find the three most "
             "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore "
             "the dots '....'. What are the three most frequently appeared words in the above coded text?"
             + " Answer: According to the coded text above, the three most frequently appeared words are:")
RULER_QA = ("Answer the question based on the given documents. Only give me the answer and do not output any other "
            "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
            "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}"
            + " Answer:")
RULER_QA_DOCUMENT = "Document {i}:\n{document}"


class WordTokenizer:
    """A subword-like stand-in: one id per word, punctuation mark or whitespace run (ids from a
    growing table), with an exact decode."""

    name, eos_id = "words", 0

    def __init__(self):
        self.table: dict[str, int] = {}
        self.pieces: dict[int, str] = {}

    def encode(self, text: str) -> list[int]:
        ids = []
        for piece in re.findall(r"\w+|[^\w\s]|\s+", text):
            i = self.table.setdefault(piece, len(self.table) + 1)
            self.pieces[i] = piece
            ids.append(i)
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids)


WORDS = WordTokenizer()
TOKENIZERS = {"byte": TOK, "words": WORDS}


def _strict_top(counts: Counter, k: int) -> set[str]:
    """The k most frequent keys, asserting they are strictly more frequent than every other key."""
    ranked = counts.most_common()
    assert len(ranked) >= k
    if len(ranked) > k:
        assert ranked[k - 1][1] > ranked[k][1], f"ranks {k} and {k + 1} tie: {ranked[:k + 3]}"
    return {w for w, _ in ranked[:k]}


# ---------------------------------------------------------------------------------------------
# templates and scorers against RULER's text


def test_templates_are_rulers():
    assert VT_TEMPLATE == RULER_VT
    assert CWE_TEMPLATE == RULER_CWE
    assert FWE_TEMPLATE == RULER_FWE
    assert QA_TEMPLATE == RULER_QA
    assert QA_DOCUMENT == RULER_QA_DOCUMENT
    docs = ["first doc", "second doc"]
    joined = "\n\n".join(QA_DOCUMENT.format(i=i + 1, document=d) for i, d in enumerate(docs))
    assert joined == "Document 1:\nfirst doc\n\nDocument 2:\nsecond doc"
    # every field is filled by format (no stray braces)
    assert "{" not in VT_TEMPLATE.format(context="c", query="12345", num_v=5)
    assert "{" not in CWE_TEMPLATE.format(context="c")
    assert "{" not in FWE_TEMPLATE.format(context="c")
    assert "{" not in QA_TEMPLATE.format(context="c", query="q")


def _ruler_all(preds, refs):
    return round(sum(sum(r.lower() in p.lower() for r in ref) / len(ref) for p, ref in zip(preds, refs))
                 / len(preds) * 100, 2)


def _ruler_part(preds, refs):
    return round(sum(max(r.lower() in p.lower() for r in ref) for p, ref in zip(preds, refs)) / len(preds) * 100, 2)


def test_scorers_match_rulers():
    preds = ["The special magic numbers are 123 and 456", "nothing"]
    assert string_match_all(preds, [["123", "456"], ["789"]]) == 50.0
    assert string_match_all(preds, [["123", "999"], ["789"]]) == 25.0
    assert string_match_part(preds, [["123", "999"], ["789"]]) == 50.0
    assert string_match_part(preds, [["999"], ["789"]]) == 0.0
    # case-insensitive both ways
    assert string_match_all(["abc"], [["ABC"]]) == 100.0
    assert string_match_all(["ABC"], [["abc"]]) == 100.0
    assert string_match_part(["xyz ABC"], [["abc", "q"]]) == 100.0
    # a vt-style answer: 3 of the 5 names
    names = ["JAJ", "VUS", "XCI", "QWE", "RTY"]
    assert string_match_all(["JAJ VUS XCI"], [names]) == 60.0
    assert sample_match_all("JAJ VUS XCI", names) == pytest.approx(60.0)
    assert sample_match_part("jaj", names) == 100.0
    assert sample_match_part("nope", names) == 0.0
    # rounding to two decimals like RULER
    assert string_match_all(["a", "a", "b"], [["a"], ["a"], ["a"]]) == 66.67
    cases = [
        (["The special magic numbers are 123 and 456", "nothing"], [["123", "456"], ["789"]]),
        (["1. Apple 2. pear", "x", "CAT dog"], [["apple", "plum", "pear"], ["x"], ["cat", "Dog", "emu"]]),
        (["JAJ VUS XCI"], [names]),
    ]
    for p, r in cases:
        assert string_match_all(p, r) == _ruler_all(p, r)
        assert string_match_part(p, r) == _ruler_part(p, r)
    assert postprocess_pred("  a\tb\x00c \n") == "a\nb\nc"


# ---------------------------------------------------------------------------------------------
# variable tracking

VT_HEAD, VT_TAIL = RULER_VT.split("{context}")
VT_LINE = re.compile(r"VAR ([A-Z]+) = (?:VAR ([A-Z]+) |(\d+))")


def _parse_vt(section: str, letters: int) -> tuple[str, list[str]]:
    """One vt section (template filled, up to the answer prefix): the asked value and the chain
    of names assigned it, found by following the assignments in the context."""
    assert section.startswith(VT_HEAD)
    asked = re.findall(r"\nQuestion: Find all variables that are assigned the value (\d+) in the text above\.",
                       section)
    assert len(asked) == 1
    value = asked[0]
    assert section.endswith(VT_TAIL.format(query=value, num_v=5))
    context = section[len(VT_HEAD):len(section) - len(VT_TAIL.format(query=value, num_v=5))]
    assignments, noise = [], []
    for line in context.split("\n"):
        m = VT_LINE.fullmatch(line)
        if m:
            assignments.append(m.groups())
        else:
            assert "VAR" not in line
            noise.append(line)
    # the noise is RULER's noise paragraph, one per line; only the first line may be cut at its start
    for j, line in enumerate(noise):
        assert line == NIAH_NOISE or (j == 0 and NIAH_NOISE.endswith(line)), repr(line)
    # follow the assignments from the value: who takes it, then who takes theirs, ...
    found = [x for x, _, v in assignments if v == value]
    assert len(found) == 1
    changed = True
    while changed:
        changed = False
        for x, y, _ in assignments:
            if y in found and x not in found:
                found.append(x)
                changed = True
    # the chain is the whole of the assignments, its lines in order, each name `letters` capitals
    assert len(assignments) == len(found) == 5
    assert [x for x, _, _ in assignments] == found
    assert all(re.fullmatch(f"[A-Z]{{{letters}}}", x) for x in found)
    return value, found


@pytest.mark.parametrize("tok_name,length", [("byte", 512), ("byte", 1024), ("byte", 2048), ("byte", 8192),
                                             ("words", 2048)])
def test_vt_answers_follow_the_chain(tok_name, length):
    tok = TOKENIZERS[tok_name]
    samples = vt_samples(tok, length, 3, seed=5)
    assert len(samples) == 3
    for s in samples:
        assert len(s.prompt) == length - 30 == s.meta["prompt_tokens"]
        text = tok.decode(s.prompt)
        start = text.rindex("Memorize and track")
        task, example = text[start:], text[:start]
        value, chain = _parse_vt(task, letters=5)
        assert set(chain) == set(s.answers) and len(s.answers) == 5
        assert value == s.meta["value"] and 10_000 <= int(value) <= 99_998
        assert text.endswith(f"5 variables are assigned the value {value}, they are: ")
        assert s.meta["one_shot"] == bool(example)
        if tok_name == "byte":
            # the 500-token example does not fit beside the task at 512 bytes; it does from 1024 on
            assert s.meta["one_shot"] == (length > 512)
        if example:
            assert example.count("Memorize and track") == 1 and example.endswith("\n")
            cut = example.rindex("they are: ") + len("they are: ")
            _, ex_chain = _parse_vt(example[:cut], letters=3)
            # the example's own answer line lists its own chain
            assert example[cut:].split() == ex_chain
            assert not set(ex_chain) & set(s.answers)
            assert tok.decode(s.prompt[:500]) == example  # RULER's 500-token example, exactly
            assert example[cut:] == " " + " ".join(ex_chain) + "\n\n"  # RULER: answer, newline, then a blank line


# ---------------------------------------------------------------------------------------------
# common words extraction

CWE_HEAD, CWE_TAIL = RULER_CWE.split("{context}")
CWE_ITEM = re.compile(r"(\d+)\. ([a-z]+)")


def _cwe_items(listing: str, may_be_cut: bool) -> list[str]:
    """The words of a numbered list's whole items, in order. A list that may be cut at its start
    counts its first item only where that is evidently whole: the list starts on an item
    boundary (" k. word") or is not cut at all ("1. word 2. ...")."""
    items = [(m.start(), int(m.group(1)), m.group(2)) for m in re.finditer(r"(?:(?<= )|^)(\d+)\. ([a-z]+)", listing)]
    assert items
    if not may_be_cut:
        assert listing.startswith("1. ")
    elif re.match(r" \d+\. [a-z]", listing) or (listing.startswith("1. ") and len(items) > 1 and items[1][1] == 2):
        pass  # cut exactly between two items, or not cut
    else:  # the first item lost its start: what is left is the end of "n. word"
        items = [it for it in items if it[0] > 0]
        assert re.fullmatch(r"(\d*\.)? ?[a-z]+", listing[:items[0][0] - 1]), listing[:40]
    # nothing else in the list but items "n. word" joined by single spaces, numbered consecutively
    rest = listing[items[0][0]:]
    assert rest == " ".join(f"{n}. {w}" for _, n, w in items)
    numbers = [n for _, n, _ in items]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    return [w for _, _, w in items]


@pytest.mark.parametrize("tok_name,length", [("byte", 2048), ("byte", 8192), ("words", 2048), ("words", 4096)])
def test_cwe_answers_are_the_most_common_words(tok_name, length):
    tok = TOKENIZERS[tok_name]
    samples = cwe_samples(tok, length, 3, seed=7)
    (ex_words, ex_common, ex_rare), (common, rare) = cwe_counts(length)
    assert (common, rare) == ((6, 1) if length < 4096 else (30, 3))
    vocabulary = set(word_list())
    for s in samples:
        assert len(s.prompt) == length - 120 == s.meta["prompt_tokens"]
        assert (s.meta["common"], s.meta["rare"]) == (common, rare)
        text = tok.decode(s.prompt)
        start = text.rindex("Below is a numbered list")
        task, example = text[start:], text[:start]
        assert task.startswith(CWE_HEAD) and task.endswith(CWE_TAIL)
        words = _cwe_items(task[len(CWE_HEAD):len(task) - len(CWE_TAIL)], may_be_cut=True)
        assert len(words) == s.meta["items"]
        counts = Counter(words)
        assert set(words) <= vocabulary
        assert _strict_top(counts, 10) == set(s.answers) and len(set(s.answers)) == 10
        # the common words appear `common` times (one may have lost items to the cut), the rest at most `rare`
        assert max(counts[a] for a in s.answers) == common
        assert max(c for w, c in counts.items() if w not in s.answers) <= rare
        assert s.meta["one_shot"] == bool(example)
        if example:
            assert example.startswith(CWE_HEAD) and example.count("Below is a numbered list") == 1
            body, answer = example.split(CWE_TAIL)
            ex_list = _cwe_items(body[len(CWE_HEAD):], may_be_cut=False)
            ex_counts = Counter(ex_list)
            assert len(ex_counts) == ex_words and len(ex_list) == 10 * ex_common + (ex_words - 10) * ex_rare
            listed = CWE_ITEM.findall(answer)
            assert answer == " " + " ".join(f"{n}. {w}" for n, w in listed) + "\n"
            assert [int(n) for n, _ in listed] == list(range(1, 11))
            assert _strict_top(ex_counts, 10) == {w for _, w in listed}


def test_cwe_counts_switch_at_4096():
    assert cwe_counts(2048) == ((20, 3, 1), (6, 1))
    assert cwe_counts(4095) == ((20, 3, 1), (6, 1))
    assert cwe_counts(4096) == ((40, 10, 3), (30, 3))
    assert cwe_counts(131072) == ((40, 10, 3), (30, 3))


def test_cwe_too_short_is_reported():
    with pytest.raises(PromptTooLong, match="cwe"):
        cwe_samples(TOK, 512, 1, seed=0)


# ---------------------------------------------------------------------------------------------
# frequent words extraction

FWE_HEAD, FWE_TAIL = RULER_FWE.split("{context}")


@pytest.mark.parametrize("tok_name,length", [("byte", 512), ("byte", 2048), ("byte", 8192), ("words", 2048)])
def test_fwe_answers_are_the_most_frequent_coded_words(tok_name, length):
    tok = TOKENIZERS[tok_name]
    samples = fwe_samples(tok, length, 3, seed=11)
    for s in samples:
        assert len(s.prompt) == length - 50 == s.meta["prompt_tokens"]
        assert s.meta["vocab_size"] == (length - 50) // 50
        text = tok.decode(s.prompt)
        assert text.startswith(FWE_HEAD) and text.endswith(FWE_TAIL)
        coded = text[len(FWE_HEAD):len(text) - len(FWE_TAIL)]
        tokens = coded.split()
        first_whole = coded.startswith(" ")  # the text was cut between two words
        if not first_whole:
            head = tokens[0]
            assert re.fullmatch(r"[a-z]{1,6}|\.{1,3}", head)  # what is left of a cut word
            tokens = tokens[1:]
        assert all(t == "..." or re.fullmatch(r"[a-z]{6}", t) for t in tokens)
        counts = Counter(t for t in tokens if t != "...")
        assert len(counts) <= s.meta["vocab_size"] - 1
        assert _strict_top(counts, 3) == set(s.answers) and len(set(s.answers)) == 3
        assert [counts[a] for a in s.answers] == s.meta["answer_counts"]
        if length >= 2048:
            # Zipf ranks 2, 3, 4 (about n/4, n/9, n/16 over zeta(2)): far enough apart that the cut keeps their order
            assert s.meta["answer_counts"] == sorted(s.meta["answer_counts"], reverse=True)
            # RULER replaces the top-ranked word by the noise dots: they are the most frequent token
            dots = tokens.count("...")
            assert dots > max(counts.values())
            assert dots > 2 * counts[s.answers[0]]


def test_zeta_and_zipf_counts():
    assert zeta(2.0) == pytest.approx(math.pi ** 2 / 6, abs=1e-6)
    assert zeta(3.0) == pytest.approx(1.2020569, abs=1e-6)
    assert zeta(4.0) == pytest.approx(math.pi ** 4 / 90, abs=1e-6)
    assert fwe_counts(1000, 5) == [int(1000 * k ** -2 / zeta(2)) for k in range(1, 6)]
    assert fwe_counts(1000, 5) == [607, 151, 67, 37, 24]


# ---------------------------------------------------------------------------------------------
# determinism and the word list


@pytest.mark.parametrize("make,length", [(vt_samples, 1024), (cwe_samples, 2048), (fwe_samples, 2048)])
def test_same_seed_same_prompts(make, length):
    first = make(TOK, length, 3, 1)
    again = make(TOK, length, 3, 1)
    other = make(TOK, length, 3, 2)
    assert [s.prompt for s in first] == [s.prompt for s in again]
    assert [s.answers for s in first] == [s.answers for s in again]
    assert [s.prompt for s in first] != [s.prompt for s in other]
    assert all(a.prompt != b.prompt for a, b in zip(first, other))
    # the samples of one call differ from each other
    assert len({tuple(s.prompt) for s in first}) == 3


def test_word_list_is_lowercase_real_words():
    words = word_list()
    assert len(words) > 5000
    assert all(re.fullmatch(r"[a-z]+", w) for w in words)
    assert list(words) == sorted(set(words))
    for common in ("apple", "dog", "house", "table", "car", "happy", "run"):
        assert common in words
    # the lists' entries with capitals, hyphens or spaces are left out
    assert "atm" not in words and "ATM" not in words and "brother-in-law" not in words
