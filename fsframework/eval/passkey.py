"""Passkey retrieval (the runway-rewiring protocol, docs/evaluation.md).

"The passkey is NNNNN." (five digits) sits in natural English text at one of 10
depths from 0 to 100%; the prompt ends with "The passkey is" and a sample is
correct when the generation's first number is exactly the five digits.
Sample i uses depth `PASSKEY_DEPTHS[i % 10]`, so 100 samples give the paper's
10 runs per depth. The prompt's strings live in `fsframework.data.templates`
(shared with the training documents of the embedded corpus).
"""

from __future__ import annotations

import random

from fsframework.data.templates import PASSKEY_HEAD, PASSKEY_NEEDLE, PASSKEY_TAIL
from fsframework.eval.prompts import NaturalHaystack, Sample, assemble

PASSKEY_DEPTHS = tuple(100.0 * i / 9 for i in range(10))
PASSKEY_GEN_TOKENS = 16


def passkey_samples(tokenizer, length: int, num_samples: int, seed: int, *, gen_tokens: int = PASSKEY_GEN_TOKENS,
                    haystack: NaturalHaystack | None = None) -> list[Sample]:
    """`num_samples` passkey prompts of exactly `length - gen_tokens` tokens."""
    rng = random.Random(f"{seed}:passkey:{length}")
    haystack = haystack or NaturalHaystack(tokenizer)
    head, tail = tokenizer.encode(PASSKEY_HEAD), tokenizer.encode(PASSKEY_TAIL)
    out = []
    for i in range(num_samples):
        depth_index = i % len(PASSKEY_DEPTHS)
        depth = PASSKEY_DEPTHS[depth_index]
        key = str(rng.randint(10_000, 99_999))
        needle = tokenizer.encode(PASSKEY_NEEDLE.format(key=key) + haystack.sep)
        prompt, info = assemble(head, tail, [(needle, depth)], haystack, rng, length - gen_tokens)
        out.append(Sample(prompt, [key], {
            "task": "passkey", "length": length, "index": i, "depth": round(depth, 2), "depth_index": depth_index,
            "depth_actual": info[0]["depth_actual"], "prompt_tokens": len(prompt),
            # tokens between the needle's end and where generation begins: can a local window reach it?
            "needle_tokens_back": len(prompt) - info[0]["token_end"]}))
    return out
