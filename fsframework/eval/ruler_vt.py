"""RULER variable tracking (`vt`; RULER `variable_tracking.py`, docs/evaluation.md §4.1).

One chain of `VT_HOPS` = 4 hops, `VAR A = 12345`, `VAR B = VAR A `, ..., `VAR E = VAR D `,
its lines inserted in order at random lines of the noise haystack (RULER's noise paragraph,
one per line). The question gives the value; the answer is every variable of the chain (5
names of 5 capital letters), scored with `string_match_all`. 30 generated tokens.

Before the prompt stands RULER's one-shot example: the same task on a chain of 3-letter
names and its own value, `VT_ONE_SHOT_TOKENS` = 500 tokens long (RULER builds its example
within 500 tokens), followed by its answer. Where this differs from RULER: the example is
exactly 500 tokens (RULER: the most noise lines under 500), the chain's lines sit on
noise-line boundaries at depths drawn from RULER's 40-point grid (RULER: random line
indices), the noise is cut at token level so the prompt is exactly `length - 30` tokens, and a
length without room for the example beside the task runs the task zero-shot (`meta["one_shot"]`
False; RULER has no such case at its lengths, but a byte-level model at 512 tokens does).
"""

from __future__ import annotations

import random
import string

from fsframework.data.templates import VT_TEMPLATE
from fsframework.eval.niah import DEPTH_GRID
from fsframework.eval.prompts import NoiseHaystack, PromptTooLong, Sample, assemble

VT_GEN_TOKENS = 30
VT_HOPS = 4
VT_ONE_SHOT_TOKENS = 500
NAME_LETTERS = 5  # RULER: 5 letters in the task, 3 in its one-shot example


def _names(rng: random.Random, count: int, letters: int, exclude: set[str]) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choices(string.ascii_uppercase, k=letters))
        if name not in exclude and name not in names:
            names.append(name)
    return names


def chain_lines(names: list[str], value: str) -> list[str]:
    """RULER's chain: the first name takes the value, each next name the previous one (the
    trailing space after `VAR X` is RULER's)."""
    return [f"VAR {names[0]} = {value}"] + [f"VAR {b} = VAR {a} " for a, b in zip(names, names[1:])]


def _prompt(tokenizer, rng: random.Random, names: list[str], value: str, head: list[int], budget: int,
            tail_text: str = "") -> tuple[list[int], list[dict]]:
    """`head` + RULER's template around a noise haystack holding the chain, exactly `budget` tokens."""
    haystack = NoiseHaystack(tokenizer)
    before, after = VT_TEMPLATE.format(context="\0", query=value, num_v=len(names)).split("\0")
    # the noise lines and chain lines each end with "\n": the template's own newline after the context is theirs
    after = after.removeprefix("\n") + tail_text
    depths = sorted(rng.sample(DEPTH_GRID, len(names)))
    needles = [(tokenizer.encode(line + haystack.sep), float(depth)) for line, depth in zip(chain_lines(names, value),
                                                                                              depths)]
    return assemble(head + tokenizer.encode(before), tokenizer.encode(after), needles, haystack, rng, budget)


def one_shot_example(tokenizer, rng: random.Random, used: set[str]) -> list[int]:
    """RULER's example: a 3-letter chain in its own noise, the question, its answer, and the
    blank line RULER puts between it and the task."""
    names = _names(rng, VT_HOPS + 1, 3, used)
    used.update(names)
    value = str(rng.randint(10_000, 99_998))
    example, _ = _prompt(tokenizer, rng, names, value, [], VT_ONE_SHOT_TOKENS, tail_text=" " + " ".join(names) + "\n\n")
    return example


def vt_samples(tokenizer, length: int, num_samples: int, seed: int, *, gen_tokens: int = VT_GEN_TOKENS
               ) -> list[Sample]:
    """`num_samples` variable-tracking prompts of exactly `length - gen_tokens` tokens, each after
    its own one-shot example; `answers` are the chain's five names."""
    rng = random.Random(f"{seed}:vt:{length}")
    out = []
    for i in range(num_samples):
        used: set[str] = set()
        names = _names(rng, VT_HOPS + 1, NAME_LETTERS, used)
        used.update(names)
        value = str(rng.randint(10_000, 99_998))  # RULER: np.random.randint(10000, 99999)
        example = one_shot_example(tokenizer, rng, used)
        try:
            prompt, info = _prompt(tokenizer, rng, names, value, example, length - gen_tokens)
        except PromptTooLong:  # no room for the example: the sample is zero-shot
            example = []
            prompt, info = _prompt(tokenizer, rng, names, value, example, length - gen_tokens)
        out.append(Sample(prompt, list(names), {
            "task": "vt", "length": length, "index": i, "value": value, "chain": chain_lines(names, value),
            "depth_actual": info[0]["depth_actual"], "prompt_tokens": len(prompt), "one_shot": bool(example),
            "needle_tokens_back": len(prompt) - info[0]["token_end"]}))
    return out
