"""Small QA files in the official SQuAD v2.0 and HotpotQA formats, written from the standard
library's documentation: what the tests and a first run of `qa_1` / `qa_2` read when the
official files are not at hand (`tools/write_qa_fixture.py DIR`). They exercise the loaders and
the prompts, not a model's reading: the questions are cloze questions about the paragraphs
("Which word completes ...?"), the answer a word of the gold paragraph. Scores on them are
not comparable with RULER's; use the official files for that (docs/evaluation.md §4.1).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from fsframework.eval.prompts import _prose_sentences
from fsframework.eval.ruler_qa import QA_FILES

_WORD = re.compile(r"\b[a-z]{5,}\b")


def _sentences(rng: random.Random, low: int, high: int) -> list[str]:
    usable = [s for s in _prose_sentences(300_000) if low <= len(s) <= high and _WORD.search(s[10:])
              and s.isascii()]
    rng.shuffle(usable)
    return usable


def _cloze(rng: random.Random, sentence: str, about: str = "") -> tuple[str, str, int]:
    """A question whose answer is one word of `sentence`: (question, answer, its offset in the sentence)."""
    found = [m for m in _WORD.finditer(sentence) if m.start() >= 10]
    word = rng.choice(found)
    where = f" in the text about {about}" if about else ""
    return f'Which word completes "{sentence[:word.start()].strip()} ..."{where}?', word.group(0), word.start()


def squad_fixture(seed: int = 0, articles: int = 6, paragraphs: int = 4) -> dict:
    rng = random.Random(f"squad:{seed}")
    pool = iter(_sentences(rng, 60, 160))
    data, qid = [], 0
    for a in range(articles):
        article = {"title": f"Article_{a}", "paragraphs": []}
        for _ in range(paragraphs):
            sentences = [next(pool) for _ in range(rng.randint(2, 3))]
            context = " ".join(sentences)
            qas = []
            for sentence in rng.sample(sentences, 2):
                question, answer, offset = _cloze(rng, sentence)
                start = context.index(sentence) + offset
                qas.append({"id": f"q{qid}", "question": question, "is_impossible": False,
                            "answers": [{"text": answer, "answer_start": start}] * 2})  # SQuAD lists 1-3 (often equal)
                qid += 1
            qas.append({"id": f"q{qid}", "question": "Which word is in no paragraph at all?", "is_impossible": True,
                        "answers": [], "plausible_answers": [{"text": "nothing", "answer_start": 0}]})
            qid += 1
            article["paragraphs"].append({"context": context, "qas": qas})
        data.append(article)
    return {"version": "v2.0", "data": data}


def hotpot_fixture(seed: int = 0, examples: int = 12) -> list:
    rng = random.Random(f"hotpot:{seed}")
    pool = iter(_sentences(rng, 40, 110))
    out = []
    for e in range(examples):
        titles = [f"Topic {e}-{k}" for k in range(10)]
        context = [[t, [(" " if j else "") + next(pool) for j in range(rng.randint(1, 2))]] for t in titles]
        first, second = rng.sample(range(10), 2)
        sentence = context[first][1][0].strip()
        question, answer, _ = _cloze(rng, sentence, about=titles[second])
        out.append({"_id": f"h{e}", "question": question, "answer": answer, "type": "bridge", "level": "easy",
                    "supporting_facts": [[titles[first], 0], [titles[second], 0]], "context": context})
    return out


def write_qa_fixture(out_dir, seed: int = 0, replace: bool = True) -> dict[str, Path]:
    """Write both files under their official names in `out_dir`; returns their paths by task.
    `replace=False` refuses to write over a file already there (it may be the official one)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out} is a file, not a folder")
    there = [out / name for name in QA_FILES.values() if (out / name).exists()]
    if there and not replace:
        raise FileExistsError(f"{there[0]} already exists (the official file?); choose another folder")
    out.mkdir(parents=True, exist_ok=True)
    files = {"qa_1": (squad_fixture(seed)), "qa_2": hotpot_fixture(seed)}
    paths = {}
    for task, content in files.items():
        paths[task] = out / QA_FILES[task]
        paths[task].write_text(json.dumps(content, indent=1), encoding="utf-8")
    return paths
