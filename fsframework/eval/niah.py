"""RULER needle-in-a-haystack tasks (NVIDIA RULER, `niah` family).

Prompts are assembled in token space by `fsframework.eval.prompts`: exactly
`length - generation budget` tokens, needles on haystack unit boundaries
(sentences, noise lines or distractor needles) nearest to their requested depth.

RULER task settings reproduced (RULER `synthetic.yaml`):

| task             | haystack | key   | value   | keys | values | queries |
|------------------|----------|-------|---------|------|--------|---------|
| niah_single_1    | noise    | words | numbers | 1    | 1      | 1       |
| niah_single_2    | essay    | words | numbers | 1    | 1      | 1       |
| niah_single_3    | essay    | words | uuids   | 1    | 1      | 1       |
| niah_multikey_1  | essay    | words | numbers | 4    | 1      | 1       |
| niah_multikey_2  | needle   | words | numbers | 1    | 1      | 1       |
| niah_multikey_3  | needle   | uuids | uuids   | 1    | 1      | 1       |
| niah_multivalue  | essay    | words | numbers | 1    | 4      | 1       |
| niah_multiquery  | essay    | words | numbers | 4    | 1      | 4       |

Templates, needle wording ("numbers"/"uuids"/"words" variants; the strings live in
`fsframework.data.templates`, shared with the training documents), the singular
rewording when one value is asked, the multi-query join ("a, b, and c"), 7-digit
values, UUID4 values and the 128-token generation budget follow RULER. Where this
differs from RULER, and why:

- "essay" is natural English text from the standard library's documentation,
  starting at a random sentence per sample (RULER: Paul Graham essays, always
  from the start; they would need a download).
- The queried needle's depth is spread evenly over 0..100% across samples
  (RULER draws every needle's depth at random from its 40-point grid; here only
  the extra needles do), for the noise and distractor haystacks too (RULER
  inserts those at random line indices).
- The haystack is cut at token level so every prompt is exactly
  `length - gen_tokens` tokens (RULER fits whole words/lines and leaves slack).
  The cut removes the start of the first haystack unit.
- Keys and values are checked to be distinct (distractors included); RULER
  draws them independently.
"""

from __future__ import annotations

import random

from fsframework.data.templates import NIAH_NEEDLE, NIAH_TEMPLATE
from fsframework.eval.prompts import (KeyStream, NaturalHaystack, NoiseHaystack, Sample, UnitHaystack, assemble,
                                      spread_depths)

# RULER's DEPTHS: 40 evenly spaced integer percentages, used for the extra needles of a sample
DEPTH_GRID = tuple(round(100 * i / 39) for i in range(40))
NIAH_GEN_TOKENS = 128  # RULER's tokens_to_generate for the niah tasks

NIAH_TASKS = {
    "niah_single_1": dict(haystack="noise", type_k="words", type_v="numbers", keys=1, values=1, queries=1),
    "niah_single_2": dict(haystack="essay", type_k="words", type_v="numbers", keys=1, values=1, queries=1),
    "niah_single_3": dict(haystack="essay", type_k="words", type_v="uuids", keys=1, values=1, queries=1),
    "niah_multikey_1": dict(haystack="essay", type_k="words", type_v="numbers", keys=4, values=1, queries=1),
    "niah_multikey_2": dict(haystack="needle", type_k="words", type_v="numbers", keys=1, values=1, queries=1),
    "niah_multikey_3": dict(haystack="needle", type_k="uuids", type_v="uuids", keys=1, values=1, queries=1),
    "niah_multivalue": dict(haystack="essay", type_k="words", type_v="numbers", keys=1, values=4, queries=1),
    "niah_multiquery": dict(haystack="essay", type_k="words", type_v="numbers", keys=4, values=1, queries=4),
}


class NeedleHaystack(UnitHaystack):
    """RULER's "needle" haystack: a line per distractor needle, keys and values fresh and
    distinct from the sample's own (passed through the two KeyStreams)."""

    sep = "\n"

    def __init__(self, tokenizer, type_v: str, keys: KeyStream, values: KeyStream):
        super().__init__(tokenizer)
        self.type_v, self.keys, self.values = type_v, keys, values

    def unit_ids(self, j: int) -> list[int]:
        if j not in self._cache:
            text = NIAH_NEEDLE.format(type_v=self.type_v, key=self.keys.next(), value=self.values.next())
            self._cache[j] = self.tokenizer.encode(text + self.sep)
        return self._cache[j]


def _template(cfg: dict, query: str) -> tuple[str, str]:
    template, type_v = NIAH_TEMPLATE, cfg["type_v"]
    if cfg["queries"] * cfg["values"] == 1:
        # RULER's singular wording when exactly one value is asked for
        template = template.replace("Some", "A").replace("are all", "is").replace("are", "is")
        type_v = type_v[:-1]
    head, tail = template.split("{context}")
    return head.format(type_v=type_v), tail.format(type_v=type_v, query=query)


def niah_samples(task: str, tokenizer, length: int, num_samples: int, seed: int, *,
                 gen_tokens: int = NIAH_GEN_TOKENS, haystack: NaturalHaystack | None = None) -> list[Sample]:
    """`num_samples` prompts of RULER task `task`, each `length - gen_tokens` tokens long.

    The (first) queried needle of sample i sits at depth `spread_depths(num_samples)[i]`;
    any other needles of the sample take distinct depths from RULER's 40-point grid.
    """
    if task not in NIAH_TASKS:
        raise ValueError(f"unknown RULER task {task!r}; choose one of {', '.join(NIAH_TASKS)}")
    cfg = NIAH_TASKS[task]
    budget = length - gen_tokens
    rng = random.Random(f"{seed}:{task}:{length}")
    if cfg["haystack"] == "essay" and haystack is None:
        haystack = NaturalHaystack(tokenizer)
    out = []
    for i, depth in enumerate(spread_depths(num_samples)):
        key_stream, value_stream = KeyStream(rng, cfg["type_k"]), KeyStream(rng, cfg["type_v"])
        keys = key_stream.take(cfg["keys"])
        values = [value_stream.take(cfg["values"]) for _ in keys]
        queried = rng.sample(range(cfg["keys"]), cfg["queries"])
        if cfg["haystack"] == "noise":
            hay = NoiseHaystack(tokenizer)
        elif cfg["haystack"] == "needle":
            hay = NeedleHaystack(tokenizer, cfg["type_v"], key_stream, value_stream)
        else:
            hay = haystack
        # needles in key order; the first value of the first queried key gets the spread depth
        needles = [(k, v) for k, vs in zip(keys, values) for v in vs]
        primary = needles.index((keys[queried[0]], values[queried[0]][0]))
        others = iter(rng.sample(DEPTH_GRID, len(needles) - 1))
        depths = [depth if n == primary else float(next(others)) for n in range(len(needles))]
        order = list(range(len(needles)))
        rng.shuffle(order)
        texts = [NIAH_NEEDLE.format(type_v=cfg["type_v"], key=k, value=v) for k, v in needles]
        needle_ids = [(tokenizer.encode(texts[n] + hay.sep), depths[n]) for n in order]
        queries = [keys[q] for q in queried]
        query = queries[0] if len(queries) == 1 else ", ".join(queries[:-1]) + ", and " + queries[-1]
        head, tail = _template(cfg, query)
        prompt, info = assemble(tokenizer.encode(head), tokenizer.encode(tail), needle_ids, hay, rng, budget)
        placed = {order[j]: info[j] for j in range(len(order))}
        answers = [v for q in queried for v in values[q]]
        out.append(Sample(prompt, answers, {
            "task": task, "length": length, "index": i, "depth": depth,
            "depth_actual": placed[primary]["depth_actual"], "query": query, "needles": texts,
            "needle_depths": [placed[n]["depth_actual"] for n in range(len(needles))],
            "prompt_tokens": len(prompt), "needle_tokens_back": len(prompt) - placed[primary]["token_end"]}))
    return out
