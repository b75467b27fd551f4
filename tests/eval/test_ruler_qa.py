"""RULER's QA tasks (qa_1: SQuAD v2.0, qa_2: HotpotQA) on the small files of `write_qa_fixture`.

The loaders are checked against the JSON read here directly, and every prompt is taken apart
from its decoded text: the question is looked up in the fixture's JSON by its text, and its gold
paragraph(s), answers and related paragraphs are found there, independently of the loaders.
"""

from __future__ import annotations

import json
import re

import pytest

from fsframework.data.tokenizers import load_tokenizer
from fsframework.eval.prompts import PromptTooLong
from fsframework.eval.qa_fixture import write_qa_fixture
from fsframework.eval.ruler_qa import MIN_FIRST_TOKENS, QADataMissing, load_qa, qa_samples, read_hotpot, read_squad

TOK = load_tokenizer("byte")
SQUAD, HOTPOT = "dev-v2.0.json", "hotpot_dev_distractor_v1.json"
FILES = {"qa_1": SQUAD, "qa_2": HOTPOT}
GEN = 32  # RULER's tokens_to_generate for qa

# RULER's QA template (scripts/data/synthetic/constants.py) around the documents, as literal text
PREFIX = ("Answer the question based on the given documents. Only give me the answer and do not output any other "
          "words.\n\nThe following are given documents.\n\n")
MIDDLE = ("\n\nAnswer the question based on the given documents. Only give me the answer and do not output any "
          "other words.\n\nQuestion: ")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("ruler_data")
    write_qa_fixture(out)
    return out


@pytest.fixture(scope="module")
def truth(data_dir):
    """What the fixture's JSON says, read here without the loaders: per task, every paragraph
    (as RULER makes it a document) and, per answerable question text, its answers, its gold
    paragraph(s) and the other paragraphs of its article (SQuAD) / example (HotpotQA)."""
    squad = json.loads((data_dir / SQUAD).read_text())
    hotpot = json.loads((data_dir / HOTPOT).read_text())
    out = {"qa_1": {"documents": set(), "questions": {}}, "qa_2": {"documents": set(), "questions": {}}}
    for article in squad["data"]:
        contexts = [p["context"] for p in article["paragraphs"]]
        out["qa_1"]["documents"].update(contexts)
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                if qa["is_impossible"]:
                    continue
                assert qa["question"] not in out["qa_1"]["questions"], "question texts are distinct"
                out["qa_1"]["questions"][qa["question"]] = {
                    "answers": [a["text"] for a in qa["answers"]], "gold": [paragraph["context"]],
                    "related": {c for c in contexts if c != paragraph["context"]}}
    for item in hotpot:
        paragraphs = {title: title + "\n" + "".join(sentences) for title, sentences in item["context"]}
        out["qa_2"]["documents"].update(paragraphs.values())
        supporting = {title for title, _ in item["supporting_facts"]}
        assert item["question"] not in out["qa_2"]["questions"]
        out["qa_2"]["questions"][item["question"]] = {
            "answers": [item["answer"]], "gold": [paragraphs[t] for t in paragraphs if t in supporting],
            "related": {p for t, p in paragraphs.items() if t not in supporting}}
    return out


# --- the fixture files and the loaders ---------------------------------------------------------------


def test_fixture_files_are_in_the_official_formats(data_dir):
    squad = json.loads((data_dir / SQUAD).read_text())
    assert squad["version"] == "v2.0"
    impossible = 0
    for article in squad["data"]:
        assert {"title", "paragraphs"} <= set(article)
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                assert {"id", "question", "answers", "is_impossible"} <= set(qa)
                if qa["is_impossible"]:
                    impossible += 1
                    assert qa["answers"] == [] and qa["plausible_answers"]
                for answer in qa["answers"]:  # the offsets point at the answer in the paragraph
                    start = answer["answer_start"]
                    assert paragraph["context"][start:start + len(answer["text"])] == answer["text"]
    assert impossible > 0
    hotpot = json.loads((data_dir / HOTPOT).read_text())
    assert isinstance(hotpot, list) and hotpot
    for item in hotpot:
        assert {"_id", "question", "answer", "type", "level", "supporting_facts", "context"} <= set(item)
        assert len(item["context"]) == 10
        titles = [title for title, _ in item["context"]]
        for title, sentence in item["supporting_facts"]:
            assert title in titles and 0 <= sentence < len(dict(item["context"])[title])
        assert all(isinstance(s, str) for _, sentences in item["context"] for s in sentences)


def test_read_squad_keeps_answerable_questions_and_sorted_distinct_paragraphs(data_dir):
    raw = json.loads((data_dir / SQUAD).read_text())
    qas = [(a, p, qa) for a in raw["data"] for p in a["paragraphs"] for qa in p["qas"]]
    answerable = [(a, p, qa) for a, p, qa in qas if not qa["is_impossible"]]
    assert len(answerable) < len(qas)
    data = read_squad(data_dir / SQUAD)
    contexts = [p["context"] for a in raw["data"] for p in a["paragraphs"]]
    assert data.documents == tuple(sorted(set(contexts)))
    assert len(data.documents) == len(contexts) == 24  # 6 articles of 4 paragraphs
    assert len(data.questions) == len(answerable) == 48  # the 24 impossible ones dropped
    for question, (article, paragraph, qa) in zip(data.questions, answerable):  # file order
        assert question.query == qa["question"]
        assert question.answers == tuple(x["text"] for x in qa["answers"])
        assert [data.documents[i] for i in question.gold] == [paragraph["context"]]
        assert sorted(data.documents[i] for i in question.related) == sorted(
            p["context"] for p in article["paragraphs"] if p is not paragraph)
        assert all(a in paragraph["context"] for a in question.answers)
    assert load_qa("qa_1", data_dir) == data


def test_read_hotpot_gold_is_the_supporting_paragraphs(data_dir):
    raw = json.loads((data_dir / HOTPOT).read_text())
    data = read_hotpot(data_dir / HOTPOT)
    paragraphs = [t + "\n" + "".join(s) for item in raw for t, s in item["context"]]
    assert data.documents == tuple(sorted(set(paragraphs)))
    assert len(data.documents) == len(paragraphs) == 12 * 10
    assert len(data.questions) == len(raw) == 12
    for question, item in zip(data.questions, raw):
        supporting = {t for t, _ in item["supporting_facts"]}
        assert len(supporting) == 2
        assert question.query == item["question"] and question.answers == (item["answer"],)
        by_title = {t: t + "\n" + "".join(s) for t, s in item["context"]}
        assert sorted(data.documents[i] for i in question.gold) == sorted(by_title[t] for t in supporting)
        assert sorted(data.documents[i] for i in question.related) == sorted(
            p for t, p in by_title.items() if t not in supporting)
        assert len(question.related) == 8
        assert any(item["answer"] in data.documents[i] for i in question.gold)
    assert load_qa("qa_2", data_dir) == data


# --- the prompts, taken apart ------------------------------------------------------------------------


def _take_apart(text: str, question: str) -> list[tuple[int | None, str]]:
    """The documents of a decoded prompt as (number, text); number None for a first document cut
    at its start (its text then is what is left of "Document 1:\\n..."). Checks the frame."""
    assert text.startswith(PREFIX)
    assert text.endswith(f"Question: {question} Answer:")
    assert text[text.rindex(MIDDLE) + len(MIDDLE):] == f"{question} Answer:"
    context = text[len(PREFIX):text.rindex(MIDDLE)]
    out = []
    for k, piece in enumerate(re.split(r"\n\n(?=Document \d+:\n)", context)):
        found = re.match(r"Document (\d+):\n", piece)
        if found:
            out.append((int(found.group(1)), piece[found.end():]))
        else:
            assert k == 0, f"only the first document may be cut, not piece {k}: {piece[:80]!r}"
            out.append((None, piece))
    return out


@pytest.mark.parametrize("task", ["qa_1", "qa_2"])
@pytest.mark.parametrize("length", [1024, 2048, 8192])
def test_prompts_hold_the_gold_paragraphs_whole_among_numbered_documents(data_dir, truth, task, length):
    samples = qa_samples(task, TOK, length, 4, seed=0, data_dir=data_dir)
    assert len(samples) == 4
    documents, questions = truth[task]["documents"], truth[task]["questions"]
    for sample in samples:
        assert len(sample.prompt) == length - GEN, "every prompt is exactly length - 32 tokens"
        assert sample.meta["prompt_tokens"] == length - GEN
        text = TOK.decode(sample.prompt)
        question = sample.meta["question"]
        expected = questions[question]  # the question, found by its text in the JSON
        assert sample.answers == expected["answers"]
        assert sorted(sample.meta["gold_documents"]) == sorted(expected["gold"])
        parts = _take_apart(text, question)
        assert len(parts) == sample.meta["documents"]

        numbers = [n for n, _ in parts if n is not None]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), "numbered consecutively"
        if parts[0][0] is None:  # a cut first document: what is left of Document 1 (possibly nothing)
            assert numbers[0] == 2
            assert any(("Document 1:\n" + d).endswith(parts[0][1]) for d in documents), parts[0][1][:80]
            assert not parts[0][1].startswith("Document 1:\n")
        else:
            assert numbers[0] in (1, 2)  # 2: the room was filled by whole documents, Document 1 cut away
        whole = [d for n, d in parts if n is not None]
        assert all(d in documents for d in whole), "every other document is a paragraph of the file, whole"

        context = text[len(PREFIX):text.rindex(MIDDLE)]
        for gold in expected["gold"]:
            assert whole.count(gold) == 1 and context.count(gold) == 1, "each gold paragraph whole, once"
        assert any(a in gold for a in sample.answers for gold in expected["gold"])
        if task == "qa_1":  # SQuAD: every answer lies in the one gold paragraph
            assert all(a in expected["gold"][0] for a in sample.answers)

        # the distractors: first the same article's / example's paragraphs, then the others
        distractors = [d for d in whole if d not in expected["gold"]]
        related = expected["related"]
        if len(distractors) >= len(related):
            assert related <= set(distractors)
        else:
            assert set(distractors) <= related
        assert all(distractors.count(d) <= 1 for d in related), "related paragraphs are not repeated"


@pytest.mark.parametrize("task", ["qa_1", "qa_2"])
def test_questions_go_in_file_order_and_those_that_do_not_fit_are_passed_over(data_dir, truth, task):
    length = 640  # the frame and the shortest gold documents fit, the longest do not
    samples = qa_samples(task, TOK, length, 6, seed=0, data_dir=data_dir)
    order = list(truth[task]["questions"])  # answerable questions in file order
    frame = len(PREFIX) + len(MIDDLE) + len(" Answer:")
    asked = [s.meta["question_index"] for s in samples]
    position = -1  # the questions' place in the file read round and round (a small file's questions come again)
    for k, sample in enumerate(samples):
        assert sample.meta["index"] == k
        assert order[sample.meta["question_index"]] == sample.meta["question"]
        position += 1 + (sample.meta["question_index"] - position - 1) % len(order)
        assert sample.meta["passed_over"] == position - k
    for i in range(min(position + 1, len(order))):  # each question reached: asked iff its gold documents fit
        query = order[i]
        gold = truth[task]["questions"][query]["gold"]
        needed = frame + len(query.encode()) + sum(len(f"Document 2:\n{g}".encode()) for g in gold) \
            + 2 * (len(gold) - 1)
        assert (i in asked) == (needed <= length - GEN), (i, needed)
    assert samples[-1].meta["passed_over"] > 0, "the length passes some questions over"


@pytest.mark.parametrize("task", ["qa_1", "qa_2"])
def test_too_short_a_length_names_the_task(data_dir, task):
    with pytest.raises(PromptTooLong, match=rf"^{task}: no question's gold documents fit in 480 tokens"):
        qa_samples(task, TOK, 512, 1, seed=0, data_dir=data_dir)


@pytest.mark.parametrize("task", ["qa_1", "qa_2"])
def test_a_missing_file_says_which_file_to_put_where(tmp_path, task):
    with pytest.raises(QADataMissing) as without_folder:
        load_qa(task, None)
    message = str(without_folder.value)
    assert FILES[task] in message and "--ruler-data" in message and "\n" not in message
    assert isinstance(without_folder.value, FileNotFoundError)

    with pytest.raises(QADataMissing) as empty_folder:
        qa_samples(task, TOK, 2048, 1, seed=0, data_dir=tmp_path)
    message = str(empty_folder.value)
    assert FILES[task] in message and str(tmp_path) in message and "\n" not in message


@pytest.mark.parametrize("task", ["qa_1", "qa_2"])
def test_a_truncated_file_is_an_error_naming_it(data_dir, tmp_path, task):
    whole = (data_dir / FILES[task]).read_text()
    path = tmp_path / FILES[task]
    path.write_text(whole[:len(whole) // 2])
    with pytest.raises(ValueError, match=re.escape(str(path))) as err:
        load_qa(task, tmp_path)
    assert not isinstance(err.value, FileNotFoundError)
    assert "not valid JSON" in str(err.value)


def test_a_file_in_the_wrong_format_is_an_error(data_dir, tmp_path):
    # each dataset's file under the other's name
    (tmp_path / SQUAD).write_text((data_dir / HOTPOT).read_text())
    (tmp_path / HOTPOT).write_text((data_dir / SQUAD).read_text())
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / SQUAD)) + ".*SQuAD"):
        load_qa("qa_1", tmp_path)
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / HOTPOT)) + ".*HotpotQA"):
        load_qa("qa_2", tmp_path)
    # valid shapes but nothing to ask
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / SQUAD).write_text(json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": [
        {"context": "c", "qas": [{"id": "1", "question": "q?", "is_impossible": True, "answers": []}]}]}]}))
    with pytest.raises(ValueError, match="no answerable question"):
        load_qa("qa_1", empty)
    # not UTF-8
    (empty / HOTPOT).write_bytes(b'[{"question": "\xff"}]')
    with pytest.raises(ValueError, match=re.escape(str(empty / HOTPOT))):
        load_qa("qa_2", empty)


@pytest.mark.parametrize("task", ["qa_1", "qa_2"])
def test_same_seed_same_prompts(data_dir, task):
    first = qa_samples(task, TOK, 2048, 3, seed=7, data_dir=data_dir)
    again = qa_samples(task, TOK, 2048, 3, seed=7, data_dir=data_dir)
    assert [s.prompt for s in first] == [s.prompt for s in again]
    assert [s.meta for s in first] == [s.meta for s in again]
    other = qa_samples(task, TOK, 2048, 3, seed=8, data_dir=data_dir)
    assert [s.meta["question"] for s in other] == [s.meta["question"] for s in first]  # sample i asks question i
    assert [s.prompt for s in other] != [s.prompt for s in first]  # with other distractors


@pytest.mark.parametrize("task, length", [("qa_2", 1024), ("qa_1", 1105), ("qa_2", 1004)])
def test_document_1_keeps_some_text_when_the_body_fills_the_room(data_dir, task, length):
    """Where the whole documents would fill the room (nearly) exactly, the last distractor gives way,
    so the cut never leaves Document 1 empty or absent."""
    head = "The following are given documents.\n\n"
    for sample in qa_samples(task, TOK, length, 4, 0, data_dir=data_dir):
        text = TOK.decode(sample.prompt)
        context = text[text.index(head) + len(head):]
        assert context.index("\n\nDocument 2:\n") >= MIN_FIRST_TOKENS, context[:40]


@pytest.mark.parametrize("task", ["qa_1", "qa_2"])
def test_short_paragraphs_never_stop_a_length(data_dir, task):
    """100 samples at 1024 bytes: where the room left for Document 1 exceeds the paragraph that did
    not fit the body, shorter paragraphs join the body and a longer one is found for Document 1."""
    samples = qa_samples(task, TOK, 1024, 100, 0, data_dir=data_dir)
    assert len(samples) == 100 and {len(s.prompt) for s in samples} == {1024 - 32}
