"""F-fact memory probe (FreeSolo, docs/evaluation.md).

A prefix of natural text holds F key-value facts with 7-digit values; the question
about one key comes only after the prefix, and each question is asked on its own
copy of the same prefix (with full forward passes that is simply `prefix +
question`). 16 greedy tokens; a query is correct when the value appears in them.
Every fact is queried for F <= 8; 8 sampled facts are queried for F = 16.

Recency guard: every fact ends at least `recent_guard` tokens before the end of
the prefix, so the answer cannot be read from the most recent context. The
paper's distance is 528 tokens; for short targets it is clipped to a quarter of
the target length (`effective_guard`), so the probe still fits at e.g. 1k tokens.
The prefix length is the same for every query of a sample: it is fitted so that
the longest question of the sample still leaves room for the generation.
"""

from __future__ import annotations

import random

from fsframework.eval.prompts import KeyStream, NaturalHaystack, PromptTooLong, Sample

FACT_COUNTS = (1, 2, 4, 8, 16)
FFACT_GEN_TOKENS = 16
RECENT_GUARD = 528
MAX_QUERIES = 8  # facts queried per prefix when F > MAX_QUERIES
# same wording as the retrieval documents of the embedded training corpus
FACT = "One of the special magic numbers for {key} is: {value}."
QUESTION = "What is the special magic number for {key}? The special magic number for {key} is:"


def effective_guard(length: int, recent_guard: int = RECENT_GUARD) -> int:
    """The recency guard used at `length`: `recent_guard`, at most a quarter of the length."""
    return min(recent_guard, length // 4)


def _prefix(haystack: NaturalHaystack, rng: random.Random, facts: list[list[int]], room: int,
            guard: int) -> tuple[list[int], list[int]]:
    """Haystack of `room` tokens with the facts inserted at random boundaries at least
    `guard` haystack tokens before its end. Returns the prefix and each fact's distance
    (tokens from the fact's end to the prefix end), in input order."""
    hay, bounds = haystack.stream(rng, room)
    allowed = [b for b in bounds if b <= room - guard]
    if not allowed:
        raise PromptTooLong(f"no position keeps a fact {guard} tokens from the end of a {room}-token haystack")
    places = sorted((rng.choice(allowed), n) for n in range(len(facts)))
    prefix, prev, ends = [], 0, {}
    for place, n in places:
        prefix.extend(hay[prev:place])
        prev = place
        prefix.extend(facts[n])
        ends[n] = len(prefix)
    prefix.extend(hay[prev:])
    return prefix, [len(prefix) - ends[n] for n in range(len(facts))]


def ffact_samples(tokenizer, length: int, num_prefixes: int, seed: int, *, counts: tuple[int, ...] = FACT_COUNTS,
                  gen_tokens: int = FFACT_GEN_TOKENS, recent_guard: int = RECENT_GUARD,
                  haystack: NaturalHaystack | None = None) -> tuple[dict[int, list[Sample]], dict[int, str]]:
    """Per fact count F: the query prompts of `num_prefixes` prefixes (at most `length -
    gen_tokens` tokens each), and per count that cannot fit at this length, the reason."""
    haystack = haystack or NaturalHaystack(tokenizer)
    guard = effective_guard(length, recent_guard)
    out: dict[int, list[Sample]] = {}
    skipped: dict[int, str] = {}
    for count in counts:
        rng = random.Random(f"{seed}:ffact:{length}:{count}")
        samples: list[Sample] = []
        try:
            for p in range(num_prefixes):
                keys = KeyStream(rng, "words").take(count)
                values = KeyStream(rng, "numbers").take(count)
                facts = [tokenizer.encode(FACT.format(key=k, value=v) + haystack.sep) for k, v in zip(keys, values)]
                questions = [tokenizer.encode(QUESTION.format(key=k)) for k in keys]
                room = length - gen_tokens - max(map(len, questions)) - sum(map(len, facts))
                if room < guard:
                    raise PromptTooLong(f"F={count}: facts and question leave {room} haystack tokens, "
                                        f"fewer than the recency guard {guard}")
                prefix, distances = _prefix(haystack, rng, facts, room, guard)
                asked = range(count) if count <= MAX_QUERIES else sorted(rng.sample(range(count), MAX_QUERIES))
                for n in asked:
                    prompt = prefix + questions[n]
                    samples.append(Sample(prompt, [values[n]], {
                        "task": "ffact", "length": length, "facts": count, "prefix": p, "key": keys[n],
                        "distance": distances[n], "depth": round(100.0 * (1 - distances[n] / len(prefix)), 2),
                        "guard": guard, "prompt_tokens": len(prompt)}))
        except PromptTooLong as exc:
            skipped[count] = str(exc)
            continue
        out[count] = samples
    return out, skipped


def queries_per_prefix(count: int) -> int:
    return min(count, MAX_QUERIES)
