"""Task generators, scorers and greedy decoding of the long-context evaluation."""

from __future__ import annotations

import re

import pytest
import torch

from fsframework.config import ModelConfig
from fsframework.data.templates import NIAH_NOISE
from fsframework.data.tokenizers import load_tokenizer
from fsframework.eval.decoding import greedy_generate
from fsframework.eval.ffact import FACT, effective_guard, ffact_samples
from fsframework.eval.passkey import PASSKEY_DEPTHS, passkey_samples
from fsframework.eval.niah import NIAH_TASKS, niah_samples
from fsframework.eval.prompts import PromptTooLong, spread_depths
from fsframework.eval.scoring import (passkey_match, postprocess_pred, sample_match_all, string_match_all,
                                      string_match_part)
from fsframework.models.registry import build_model

TOK = load_tokenizer("byte")
NEEDLE_KEYS = re.compile(r"special magic \w+ for (\S+) is: ")


class WordTokenizer:
    """A subword-like stand-in: one id per word or punctuation mark (ids from a growing table)."""

    name, eos_id = "words", 0

    def __init__(self):
        self.table: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        return [self.table.setdefault(piece, len(self.table) + 1) for piece in re.findall(r"\w+|[^\w\s]|\s+", text)]


def _text(sample) -> str:
    return TOK.decode(sample.prompt)


@pytest.mark.parametrize("task", list(NIAH_TASKS))
def test_niah_prompts_fit_and_hold_their_needles(task):
    length, gen, n = 2048, 128, 6
    samples = niah_samples(task, TOK, length, n, seed=3, gen_tokens=gen)
    assert len(samples) == n
    cfg = NIAH_TASKS[task]
    for s in samples:
        # exactly the budget: never over, and as close as possible
        assert len(s.prompt) == length - gen == s.meta["prompt_tokens"]
        text = _text(s)
        context = text.split("\nWhat ")[0]
        for needle in s.meta["needles"]:
            assert context.count(needle) == 1
        for answer in s.answers:
            assert text.count(answer) == 1
            assert any(answer in needle for needle in s.meta["needles"])
        assert len(s.answers) == cfg["queries"] * cfg["values"]
        # the primary needle (the one asked about first) ends needle_tokens_back tokens before the prompt does
        primary = next(needle for needle in s.meta["needles"] if s.answers[0] in needle)
        before = TOK.decode(s.prompt[:-s.meta["needle_tokens_back"]])
        assert before[-1].isspace() and before.rstrip().endswith(primary)
        assert text.endswith("mentioned in the provided text " + ("is" if len(s.answers) == 1 else "are"))
        keys = NEEDLE_KEYS.findall(context)
        # every key (needle or distractor) is distinct; multivalue repeats its one key per value
        assert len(set(keys)) == len(keys) // cfg["values"]
        if cfg["haystack"] == "needle":
            assert len(keys) > 10  # the haystack is made of distractor needles
        else:
            assert len(keys) == cfg["keys"] * cfg["values"]
        if cfg["haystack"] == "noise":
            assert NIAH_NOISE in context
        if cfg["type_v"] == "uuids":
            assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", s.answers[0])
        else:
            assert all(re.fullmatch(r"\d{7}", a) for a in s.answers)


def test_niah_multiquery_asks_all_keys_and_singular_wording():
    s = niah_samples("niah_multiquery", TOK, 2048, 1, seed=0)[0]
    text = _text(s)
    query = s.meta["query"]
    assert query.count(", and ") == 1 and len(query.replace(", and ", ", ").split(", ")) == 4
    assert text.startswith("Some special magic numbers are hidden")
    single = _text(niah_samples("niah_single_3", TOK, 2048, 1, seed=0)[0])
    assert single.startswith("A special magic uuid is hidden within the following text.")
    assert "What is the special magic uuid for" in single


def test_niah_depths_spread_and_deterministic():
    samples = niah_samples("niah_single_2", TOK, 4096, 5, seed=1)
    assert [s.meta["depth"] for s in samples] == spread_depths(5)
    actual = [s.meta["depth_actual"] for s in samples]
    assert actual == sorted(actual)
    assert all(abs(a - d) < 8 for a, d in zip(actual, spread_depths(5)))
    again = niah_samples("niah_single_2", TOK, 4096, 5, seed=1)
    assert [s.prompt for s in again] == [s.prompt for s in samples]
    other = niah_samples("niah_single_2", TOK, 4096, 5, seed=2)
    assert [s.prompt for s in other] != [s.prompt for s in samples]


def test_prompts_fit_with_a_subword_like_tokenizer():
    tok = WordTokenizer()
    for task in ("niah_single_1", "niah_multikey_2", "niah_multivalue"):
        for s in niah_samples(task, tok, 1500, 3, seed=0):
            assert len(s.prompt) == 1500 - 128
    for s in passkey_samples(tok, 700, 3, seed=0):
        assert len(s.prompt) == 700 - 16


def test_too_short_length_is_reported():
    with pytest.raises(PromptTooLong, match="without any haystack"):
        niah_samples("niah_multivalue", TOK, 256, 1, seed=0)


def test_passkey_samples():
    samples = passkey_samples(TOK, 1024, 20, seed=0)
    assert sorted({s.meta["depth_index"] for s in samples}) == list(range(10))
    assert {s.meta["depth"] for s in samples} == {round(d, 2) for d in PASSKEY_DEPTHS}
    for s in samples:
        text = _text(s)
        assert len(s.prompt) == 1024 - 16
        assert text.endswith("The passkey is")
        assert re.fullmatch(r"\d{5}", s.answers[0])
        assert text.count(f"The passkey is {s.answers[0]}.") == 1
        assert abs(s.meta["depth_actual"] - s.meta["depth"]) < 20
        back = s.meta["needle_tokens_back"]  # the needle ends exactly that many tokens before the prompt does
        before = TOK.decode(s.prompt[:-back])  # ends with the needle and its separator, nothing of what follows
        assert before[-1].isspace() and before.rstrip().endswith(f"The passkey is {s.answers[0]}.")


def test_ffact_guard_queries_and_shared_prefix():
    length = 2048
    by_count, skipped = ffact_samples(TOK, length, 3, seed=0)
    assert not skipped
    assert {f: len(v) for f, v in by_count.items()} == {1: 3, 2: 6, 4: 12, 8: 24, 16: 24}
    guard = effective_guard(length)
    assert guard == 512
    for count, samples in by_count.items():
        for s in samples:
            assert len(s.prompt) <= length - 16
            assert len(s.prompt) >= length - 16 - 12  # only question-length differences are left unused
            text = _text(s)
            prefix, question = text.rsplit("What is the special magic number for", 1)
            fact = FACT.format(key=s.meta["key"], value=s.answers[0])
            assert prefix.count(fact) == 1 and question.startswith(f" {s.meta['key']}?")
            assert len(prefix) - (prefix.index(fact) + len(fact)) >= guard
            assert len(NEEDLE_KEYS.findall(prefix)) == count
        prefixes = {}
        for s in samples:
            prefixes.setdefault(s.meta["prefix"], set()).add(_text(s).rsplit("What is", 1)[0])
        assert all(len(p) == 1 for p in prefixes.values()), "queries of one prefix share it"


def test_ffact_guard_scales_down_and_skips_what_cannot_fit():
    assert effective_guard(100_000) == 528 and effective_guard(1024) == 256
    by_count, skipped = ffact_samples(TOK, 1024, 1, seed=0)
    assert 16 in skipped and "guard" in skipped[16]
    assert by_count[1] and 16 not in by_count


def test_scoring_matches_ruler():
    refs = [["1234567", "7654321"]]
    assert string_match_all(["1234567 and 7654321"], refs) == 100.0
    assert string_match_all(["only 1234567"], refs) == 50.0
    assert string_match_all(["nothing"], refs) == 0.0
    assert string_match_part(["only 1234567"], refs) == 100.0
    assert string_match_part(["nothing"], refs) == 0.0
    assert string_match_all(["A1B2-UUID", "x"], [["a1b2-uuid"], ["y"]]) == 50.0  # case-insensitive, averaged
    assert sample_match_all("7654321", ["1234567", "7654321", "1111111"]) == pytest.approx(100 / 3)
    assert postprocess_pred("  42\x00x\n") == "42\nx"
    assert passkey_match(" 12345. The", "12345") == 100.0
    assert passkey_match("123456", "12345") == 0.0
    assert passkey_match("54321 12345", "12345") == 0.0
    assert passkey_match("no digits", "12345") == 0.0


def _tiny_model():
    torch.manual_seed(0)
    return build_model(ModelConfig(name="tfpp", vocab_size=260, d_model=32, n_layers=2, n_heads=2)).eval()


def test_greedy_generate_matches_argmax_loop():
    model = _tiny_model()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (7, 12, 7, 7, 3)]
    got = greedy_generate(model, prompts, 6, batch_size=2)
    for prompt, out in zip(prompts, got):
        tokens = list(prompt)
        with torch.no_grad():
            for _ in range(6):
                tokens.append(int(model(torch.tensor([tokens]))[0, -1].argmax()))
        assert out == tokens[len(prompt):]


class _Counter(torch.nn.Module):
    """Predicts last token + 1, so the continuation is known in advance."""

    def __init__(self, vocab: int = 20):
        super().__init__()
        self.vocab = vocab
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, tokens):
        return torch.nn.functional.one_hot((tokens + 1) % self.vocab, self.vocab).float()


def test_greedy_generate_stops_at_eos():
    out = greedy_generate(_Counter(), [[1, 2], [9, 3], [14]], 5, eos_id=6, batch_size=4)
    assert out == [[3, 4, 5], [4, 5], [15, 16, 17, 18, 19]]
