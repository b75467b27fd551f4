"""The prompt machinery of the retrieval tasks (NIAH and the rest of RULER, passkey, F-fact).

Every prompt is assembled in token space from separately encoded pieces:
`head + haystack[0] + needle + haystack[1] + ... + tail`. The haystack is a token
stream cut to exactly the length that makes the prompt `target - generation
budget` tokens long, so all prompts of one task and length have the same
length (they batch without padding) and prompt plus generation never exceed
the target. Needles sit on haystack unit boundaries (sentences, noise lines,
list items, documents) nearest to their requested depth; the cut removes the
start of the first haystack unit, so the text right before the question is
always whole.
"""

from __future__ import annotations

import random
import re
import uuid
from dataclasses import dataclass, field
from functools import lru_cache

from fsframework.data.stdlib_text import stdlib_prose
from fsframework.data.templates import NIAH_NOISE

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


class UnitHaystack:
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


class NaturalHaystack(UnitHaystack):
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


class NoiseHaystack(UnitHaystack):
    """RULER's repeated noise paragraph, one per line."""

    sep = "\n"

    def unit_ids(self, j: int) -> list[int]:
        if 0 not in self._cache:
            self._cache[0] = self.tokenizer.encode(NIAH_NOISE + self.sep)
        return self._cache[0]


def assemble(head: list[int], tail: list[int], needles: list[tuple[list[int], float]], haystack: UnitHaystack,
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




def cut_start(units: list[list[int]], room: int) -> tuple[list[int], int]:
    """The units' tokens joined and cut at their start to exactly `room` tokens, and how many
    tokens the cut removed. The haystacks that are not a repeating stream (a word list, coded
    text, documents) are built just long enough and cut here, so their prompts are exactly as
    long as the cyclic haystacks' (`UnitHaystack.stream`)."""
    ids = [token for unit in units for token in unit]
    if len(ids) < room:
        raise ValueError(f"{len(ids)} tokens of units cannot fill {room}")
    return ids[len(ids) - room:], len(ids) - room
