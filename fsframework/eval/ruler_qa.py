"""RULER's question answering: `qa_1` (SQuAD v2.0) and `qa_2` (HotpotQA) (RULER `qa.py`,
docs/evaluation.md §4.1).

A question's gold paragraph(s) stand among distractor paragraphs of the same dataset,
numbered "Document 1:", "Document 2:", ..., as many as fill the length; the answer is any of
the question's gold answers (`string_match_part`); 32 generated tokens.

The data are the official dev files, read from a folder the user gives (`--ruler-data DIR`,
`eval.ruler_data`) under their official names, never downloaded at run time:
- `dev-v2.0.json`: SQuAD v2.0 dev (https://rajpurkar.github.io/SQuAD-explorer/);
- `hotpot_dev_distractor_v1.json`: HotpotQA distractor dev (https://hotpotqa.github.io/).

As RULER: the documents are the files' distinct paragraphs, sorted (a HotpotQA paragraph is
its title, a newline and its sentences joined); the questions are the answerable ones in file
order, sample i asking question i; SQuAD's distractors are first the other paragraphs of the
question's article, then random paragraphs; documents repeat only when a length needs more
than the file holds. Where this differs from RULER:
- HotpotQA's gold documents are the question's two supporting paragraphs and its other eight
  paragraphs are its first distractors (RULER always keeps all ten, which cannot fit at short
  lengths; where they fit, the prompt holds the same ten);
- a question whose gold documents do not fit the length is passed over for the next one
  (RULER would loop), and counted in `meta["passed_over"]`;
- the documents are cut at the start of the first one(s) so the prompt is exactly
  `length - 32` tokens (the cut never reaches a gold document); RULER fits whole documents.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterator

from fsframework.data.templates import QA_DOCUMENT, QA_TEMPLATE
from fsframework.eval.prompts import PromptTooLong, Sample, cut_start

QA_GEN_TOKENS = 32
MIN_FIRST_TOKENS = 16  # what the cut leaves of Document 1 at least, when the body has a distractor to spare
QA_FILES = {"qa_1": "dev-v2.0.json", "qa_2": "hotpot_dev_distractor_v1.json"}
QA_SOURCES = {"qa_1": "SQuAD v2.0 dev (https://rajpurkar.github.io/SQuAD-explorer/)",
              "qa_2": "HotpotQA distractor dev (https://hotpotqa.github.io/)"}


class QADataMissing(FileNotFoundError):
    """A QA task was asked for without its official file in the RULER data folder."""


@dataclass(frozen=True)
class Question:
    query: str
    answers: tuple[str, ...]
    gold: tuple[int, ...]  # document indices that hold the answer
    related: tuple[int, ...]  # the first distractors: the same article's (SQuAD) or example's (HotpotQA)


@dataclass(frozen=True)
class QAData:
    documents: tuple[str, ...]
    questions: tuple[Question, ...]


def qa_file(task: str, data_dir) -> Path:
    """The official file of `task` in `data_dir`, or a one-line error saying which file to put where."""
    name = QA_FILES[task]
    if not data_dir:
        raise QADataMissing(f"{task} reads {QA_SOURCES[task]}: put {name} in a folder and pass --ruler-data DIR "
                            "(or eval.ruler_data=DIR)")
    path = Path(data_dir) / name
    if not path.is_file():
        raise QADataMissing(f"{task} reads {QA_SOURCES[task]}: {path} does not exist; put {name} in the folder "
                            "--ruler-data (eval.ruler_data) names")
    return path


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); is it the official file, whole?") from None


def read_squad(path: Path) -> QAData:
    """SQuAD v2.0's answerable questions and its distinct paragraphs (RULER `read_squad`)."""
    data = _read_json(path)
    try:
        articles = data["data"]
        docs = sorted({p["context"] for a in articles for p in a["paragraphs"]})
        index = {doc: i for i, doc in enumerate(docs)}
        questions = []
        for article in articles:
            same = [index[p["context"]] for p in article["paragraphs"]]
            for paragraph in article["paragraphs"]:
                gold = index[paragraph["context"]]
                for qa in paragraph["qas"]:
                    if not qa.get("is_impossible", False):
                        questions.append(Question(qa["question"], tuple(a["text"] for a in qa["answers"]), (gold,),
                                                  tuple(i for i in same if i != gold)))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not in SQuAD v2.0's format (missing {exc})") from None
    return QAData(tuple(docs), tuple(questions))


def hotpot_document(title: str, sentences: list[str]) -> str:
    return f"{title}\n{''.join(sentences)}"


def read_hotpot(path: Path) -> QAData:
    """HotpotQA's questions and its distinct paragraphs (RULER `read_hotpotqa`); the gold
    documents are a question's supporting paragraphs, its other paragraphs come first among
    the distractors."""
    data = _read_json(path)
    try:
        docs = sorted({hotpot_document(t, s) for item in data for t, s in item["context"]})
        index = {doc: i for i, doc in enumerate(docs)}
        questions = []
        for item in data:
            supporting = {title for title, _ in item["supporting_facts"]}
            paragraphs = [(t, index[hotpot_document(t, s)]) for t, s in item["context"]]
            gold = tuple(i for t, i in paragraphs if t in supporting)
            questions.append(Question(item["question"], (item["answer"],), gold,
                                      tuple(i for t, i in paragraphs if t not in supporting)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path} is not in HotpotQA's format ({exc})") from None
    return QAData(tuple(docs), tuple(questions))


@lru_cache(maxsize=4)
def _load(task: str, path: str, mtime: float) -> QAData:
    data = read_squad(Path(path)) if task == "qa_1" else read_hotpot(Path(path))
    if not data.questions:
        raise ValueError(f"{path} holds no answerable question")
    return data


def load_qa(task: str, data_dir) -> QAData:
    path = qa_file(task, data_dir)
    return _load(task, str(path), path.stat().st_mtime)


def _distractors(rng: random.Random, data: QAData, question: Question) -> Iterator[int]:
    """The related paragraphs in random order, then every other one in random order, again and
    again (a length may need more documents than the file holds, as RULER repeats them)."""
    related = list(question.related)
    rng.shuffle(related)
    yield from related
    others = [i for i in range(len(data.documents)) if i not in question.gold and i not in question.related]
    pool = others or related
    if not pool:
        raise PromptTooLong("the QA file holds no paragraph besides the question's gold ones")
    while True:
        order = list(pool)
        rng.shuffle(order)
        yield from order


def _units(tokenizer, documents: list[str], first_number: int) -> list[list[int]]:
    """"Document i:\\n..." for i from `first_number`, each ended by the "\\n\\n" between documents
    (the last one's is the template's own)."""
    return [tokenizer.encode(QA_DOCUMENT.format(i=first_number + j, document=d) + "\n\n")
            for j, d in enumerate(documents)]


def _context(tokenizer, rng: random.Random, data: QAData, question: Question, room: int
             ) -> tuple[list[int], dict] | None:
    """Token ids of the numbered documents, exactly `room` long (the last one's trailing
    "\\n\\n" belongs to the template), or None when the gold documents alone do not fit.

    The body (gold and whole distractors, in random order, numbered from 2) grows while it
    fits; Document 1 is then the distractor that did not (or the next one long enough), cut at
    its start to the room left."""
    docs = data.documents
    body = [docs[i] for i in question.gold]
    rng.shuffle(body)
    end = tokenizer.encode("\n\n")
    if sum(map(len, _units(tokenizer, body, 2))) - len(end) > room:
        return None
    pool = _distractors(rng, data, question)
    added: list[str] = []  # the whole distractors, in the order they joined the body

    def fits(documents: list[str]) -> bool:
        return sum(map(len, _units(tokenizer, documents, 2))) - len(end) <= room

    def grow(candidate: str) -> bool:
        """`candidate` joins the body at a random place if the body still fits the room."""
        trial = list(body)
        trial.insert(rng.randint(0, len(trial)), candidate)
        if not fits(trial):
            return False
        body[:] = trial
        added.append(candidate)
        return True

    candidate = docs[next(pool)]
    while grow(candidate):
        candidate = docs[next(pool)]
    body_ids = _joined(tokenizer, body, end)
    if room - len(body_ids) < MIN_FIRST_TOKENS and added:
        # the body fills the room (nearly) exactly: its last distractor gives way, so Document 1
        # keeps some of its text instead of being cut to nothing
        body.remove(added.pop())
        body_ids = _joined(tokenizer, body, end)
    # Document 1 must reach the room left: a paragraph too short for it joins the body instead
    # (it fits there, being shorter than the room left), and the next one is tried
    for _ in range(4 * len(docs) + 100):
        first = tokenizer.encode(QA_DOCUMENT.format(i=1, document=candidate) + "\n\n")
        if len(first) >= room - len(body_ids):
            ids, cut = cut_start([first, body_ids], room)
            return ids, {"documents": len(body) + (cut < len(first)),
                         "gold_documents": [docs[i] for i in question.gold]}
        if grow(candidate):
            body_ids = _joined(tokenizer, body, end)
        candidate = docs[next(pool)]
    raise PromptTooLong("the QA file's paragraphs are too short to fill the length")


def _joined(tokenizer, body: list[str], end: list[int]) -> list[int]:
    """The body's documents numbered from 2, without the last one's "\n\n" (the template's)."""
    ids = [t for unit in _units(tokenizer, body, 2) for t in unit]
    return ids[:len(ids) - len(end)] if ids[len(ids) - len(end):] == end else ids


def qa_samples(task: str, tokenizer, length: int, num_samples: int, seed: int, *, data_dir,
               gen_tokens: int = QA_GEN_TOKENS) -> list[Sample]:
    """`num_samples` prompts of `task` ("qa_1" or "qa_2") of exactly `length - gen_tokens` tokens,
    sample i asking the i-th answerable question whose gold documents fit (in file order)."""
    data = load_qa(task, data_dir)
    rng = random.Random(f"{seed}:{task}:{length}")
    head_text, tail_text = QA_TEMPLATE.split("{context}")
    head = tokenizer.encode(head_text)
    out, unfit, passed_over, q = [], set(), 0, 0
    while len(out) < num_samples:
        which = q % len(data.questions)  # a small file's questions come round again, with other distractors
        q += 1
        question = data.questions[which]
        tail = tokenizer.encode(tail_text.format(query=question.query))
        room = length - gen_tokens - len(head) - len(tail)
        found = _context(tokenizer, rng, data, question, room) if room > 0 else None
        if found is None:
            passed_over += 1
            unfit.add(which)
            if len(unfit) == len(data.questions):
                raise PromptTooLong(f"{task}: no question's gold documents fit in {length - gen_tokens} tokens")
            continue
        ids, info = found
        prompt = head + ids + tail
        out.append(Sample(prompt, list(question.answers), {
            "task": task, "length": length, "index": len(out), "question": question.query,
            "question_index": which, "passed_over": passed_over, **info,
            "prompt_tokens": len(prompt)}))
    return out
