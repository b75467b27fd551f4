"""RULER needle-in-a-haystack tasks (NVIDIA RULER, `niah` family) and the prompt machinery
that the passkey and F-fact probes share.

Every prompt is assembled in token space from separately encoded pieces:
`head + haystack[0] + needle + haystack[1] + ... + tail`. The haystack is a token
stream cut to exactly the length that makes the prompt `target - generation
budget` tokens long, so all prompts of one task and length have the same
length (they batch without padding) and prompt plus generation never exceed
the target. Needles sit on haystack unit boundaries (sentences, noise blocks or
distractor needles) nearest to their requested depth.

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
import re
import uuid
from dataclasses import dataclass, field
from functools import lru_cache

from fsframework.data.stdlib_text import stdlib_prose
from fsframework.data.templates import NIAH_NEEDLE, NIAH_NOISE, NIAH_TEMPLATE

# RULER's DEPTHS: 40 evenly spaced integer percentages, used for the extra needles of a sample
DEPTH_GRID = tuple(round(100 * i / 39) for i in range(40))
NIAH_GEN_TOKENS = 128  # RULER's tokens_to_generate for the niah tasks

RULER_TASKS = {
    "niah_single_1": dict(haystack="noise", type_k="words", type_v="numbers", keys=1, values=1, queries=1),
    "niah_single_2": dict(haystack="essay", type_k="words", type_v="numbers", keys=1, values=1, queries=1),
    "niah_single_3": dict(haystack="essay", type_k="words", type_v="uuids", keys=1, values=1, queries=1),
    "niah_multikey_1": dict(haystack="essay", type_k="words", type_v="numbers", keys=4, values=1, queries=1),
    "niah_multikey_2": dict(haystack="needle", type_k="words", type_v="numbers", keys=1, values=1, queries=1),
    "niah_multikey_3": dict(haystack="needle", type_k="uuids", type_v="uuids", keys=1, values=1, queries=1),
    "niah_multivalue": dict(haystack="essay", type_k="words", type_v="numbers", keys=1, values=4, queries=1),
    "niah_multiquery": dict(haystack="essay", type_k="words", type_v="numbers", keys=4, values=1, queries=4),
}

# word keys are "adjective-noun" pairs like RULER's (which draws them from the wonderwords lists)
_ADJECTIVES = tuple("""able acid angry ashamed awake bashful bitter blue brave bright broad busy calm careful cheap
chilly clever cloudy clumsy cold cool crazy cuddly curious damp dapper dark dear deep dizzy dry dull eager early
easy elegant empty fair faithful fancy fast fierce flat fluffy fond foolish fresh friendly funny gentle giant
glad glossy golden grumpy happy hard harsh heavy helpful hollow honest huge humble hungry icy idle jolly kind
large lazy light little lively lonely loud lucky mellow merry mighty misty modern narrow neat nervous noisy odd
old orange pale plain polite proud purple quick quiet rapid rare red rich rough round rusty sad salty scary
sharp shiny short shy silent silly simple sleepy slow small smooth soft sour spicy steady sticky stormy strong
sweet swift tall tame tender thick thin tidy tiny tough vast warm weak wet wild wise witty young zany""".split())
_NOUNS = tuple("""acorn anchor apple arrow badge bakery banjo barn basket beacon bell bicycle blanket boat bottle
bridge broom bucket butter button cabin camel candle canyon carpet castle cellar chair cherry circus cliff clock
cloud comet cookie cottage crayon crown cup curtain daisy desert diamond dolphin donkey dragon drum eagle engine
falcon feather fence ferry fiddle flute forest fountain garden garlic giraffe glove goat guitar hammer harbor
helmet hill honey horse island jacket jelly kettle kitten ladder lamp lemon lizard meadow mirror mitten monkey
needle nest notebook ocean otter owl paddle panda parrot pebble pencil pepper piano pillow planet pocket pony
potato puppet quilt rabbit radio river robot rocket saddle scooter shell ship sock spoon squirrel star statue
stone sweater tiger tomato tower train trumpet tulip turtle umbrella valley violin wagon walrus whale window
wizard yacht zebra""".split())


class PromptTooLong(ValueError):
    """The fixed parts of a prompt leave no room for a haystack at the requested length."""


@dataclass
class Sample:
    """One evaluation prompt: token ids, the strings a correct answer contains, and metadata."""

    prompt: list[int]
    answers: list[str]
    meta: dict = field(default_factory=dict)


def spread_depths(n: int) -> list[float]:
    """`n` depths (percent) evenly spread over 0..100 (a single sample sits at 50%)."""
    if n <= 1:
        return [50.0] * n
    return [100.0 * i / (n - 1) for i in range(n)]


class KeyStream:
    """Distinct random keys or values of one kind ("words", "numbers" or "uuids").

    Rejection sampling against everything issued so far and `exclude`; once the
    adjective-noun space gets crowded, words grow a second adjective so very long
    distractor haystacks still get distinct keys.
    """

    def __init__(self, rng: random.Random, kind: str, exclude: set[str] | None = None):
        if kind not in ("words", "numbers", "uuids"):
            raise ValueError(f"unknown key/value kind {kind!r}; choose words, numbers or uuids")
        self.rng, self.kind = rng, kind
        self.used = set(exclude or ())

    def _draw(self, attempt: int) -> str:
        rng = self.rng
        if self.kind == "numbers":
            return str(rng.randint(1_000_000, 9_999_999))  # 7 digits, as RULER
        if self.kind == "uuids":
            return str(uuid.UUID(int=rng.getrandbits(128), version=4))
        if attempt < 20:
            return f"{rng.choice(_ADJECTIVES)}-{rng.choice(_NOUNS)}"
        return f"{rng.choice(_ADJECTIVES)}-{rng.choice(_ADJECTIVES)}-{rng.choice(_NOUNS)}"

    def next(self) -> str:
        for attempt in range(1000):
            item = self._draw(attempt)
            if item not in self.used:
                self.used.add(item)
                return item
        raise RuntimeError(f"could not draw a new distinct {self.kind} item")

    def take(self, n: int) -> list[str]:
        return [self.next() for _ in range(n)]


def _split_sentences(text: str, max_chars: int = 200) -> list[str]:
    """Sentence-ish units; long runs without sentence ends (grammar, code) split at spaces."""
    out = []
    for sent in re.split(r"(?<=[.!?])\s+(?=[A-Z\"'(])", text):
        while len(sent) > max_chars:
            cut = sent.rfind(" ", 0, max_chars)
            cut = cut if cut > 0 else max_chars
            out.append(sent[:cut])
            sent = sent[cut:].lstrip()
        if sent:
            out.append(sent)
    return out


@lru_cache(maxsize=4)
def _prose_sentences(max_chars: int) -> tuple[str, ...]:
    # whitespace collapsed as RULER does for its essays
    text = re.sub(r"\s+", " ", " ".join(stdlib_prose(max_chars))).strip()
    return tuple(_split_sentences(text))


class _UnitHaystack:
    """A cyclic sequence of text units; `stream` returns exactly `n` tokens and the unit
    boundaries inside them. The stream is cut at its start, so the text right before the
    question is always whole."""

    sep = " "

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[int, list[int]] = {}

    def unit_ids(self, j: int) -> list[int]:
        raise NotImplementedError

    def first_unit(self, rng: random.Random) -> int:
        return 0

    def stream(self, rng: random.Random, n: int) -> tuple[list[int], list[int]]:
        pieces, total, j = [], 0, self.first_unit(rng)
        while total < n:
            ids = self.unit_ids(j)
            if not ids:
                raise ValueError("haystack unit encodes to no tokens")
            pieces.append(ids)
            total += len(ids)
            j += 1
        drop = total - n
        ids, bounds, pos = [], [0], -drop
        for piece in pieces:
            ids.extend(piece)
            pos += len(piece)
            if 0 < pos < n:
                bounds.append(pos)
        ids = ids[drop:]
        bounds.append(n)
        return ids, sorted(set(bounds))


class NaturalHaystack(_UnitHaystack):
    """Sentences of English prose from the standard library's documentation, starting at a
    random sentence; each sentence is encoded once and cached."""

    sep = " "

    def __init__(self, tokenizer, max_chars: int = 300_000):
        super().__init__(tokenizer)
        self.sentences = _prose_sentences(max_chars)

    def first_unit(self, rng: random.Random) -> int:
        return rng.randrange(len(self.sentences))

    def unit_ids(self, j: int) -> list[int]:
        j %= len(self.sentences)
        if j not in self._cache:
            self._cache[j] = self.tokenizer.encode(self.sentences[j] + self.sep)
        return self._cache[j]


class NoiseHaystack(_UnitHaystack):
    """RULER's repeated noise paragraph, one per line."""

    sep = "\n"

    def unit_ids(self, j: int) -> list[int]:
        if 0 not in self._cache:
            self._cache[0] = self.tokenizer.encode(NIAH_NOISE + self.sep)
        return self._cache[0]


class NeedleHaystack(_UnitHaystack):
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


def assemble(head: list[int], tail: list[int], needles: list[tuple[list[int], float]], haystack: _UnitHaystack,
             rng: random.Random, budget: int) -> tuple[list[int], list[dict]]:
    """`head + haystack with needles + tail`, exactly `budget` tokens long.

    `needles` are (token ids, depth percent); each goes to the haystack boundary nearest
    its depth. Returns the prompt and, per needle (input order), its token start, the
    requested depth and the realised depth within the context.
    """
    fixed = len(head) + len(tail) + sum(len(ids) for ids, _ in needles)
    room = budget - fixed
    if room < 0:
        raise PromptTooLong(f"prompt needs {fixed} tokens without any haystack but only {budget} are available")
    hay, bounds = haystack.stream(rng, room)
    places = []
    for idx, (_, depth) in enumerate(needles):
        target = room * depth / 100.0
        places.append((min(bounds, key=lambda b: (abs(b - target), b)), idx))
    prompt, info, prev = list(head), [None] * len(needles), 0
    context_len = room + fixed - len(head) - len(tail)
    for place, idx in sorted(places):
        prompt.extend(hay[prev:place])
        prev = place
        start = len(prompt)
        info[idx] = {"token_start": start, "token_end": start + len(needles[idx][0]), "depth": needles[idx][1],
                     "depth_actual": round(100.0 * (start - len(head)) / max(1, context_len), 2)}
        prompt.extend(needles[idx][0])
    prompt.extend(hay[prev:])
    prompt.extend(tail)
    return prompt, info


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
    if task not in RULER_TASKS:
        raise ValueError(f"unknown RULER task {task!r}; choose one of {', '.join(RULER_TASKS)}")
    cfg = RULER_TASKS[task]
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
