"""The RULER suite as a whole: one entry point for the 13 tasks, the suite mean and what it covers,
the floors, `run_eval` with "ruler" (oracle and wrong model), --stop-after-failure, and the
CLI's handling of the suite (without a model: the runner is replaced where a checkpoint would load).
"""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from fsframework.config.evaluation import EvalConfig
from fsframework.data.templates import QA_DOCUMENT, QA_TEMPLATE
from fsframework.data.tokenizers import load_tokenizer
from fsframework.eval import decoding
from fsframework.eval.prompts import NaturalHaystack
from fsframework.eval.qa_fixture import write_qa_fixture
from fsframework.eval.ruler import RULER_TASKS, ruler_samples, score_sample, suite_mean, suite_tasks
from fsframework.eval.ruler_floors import sample_floor
from fsframework.eval.ruler_qa import QADataMissing
from fsframework.eval.suite import expand_tasks, failed_at, run_eval, summary_lines
from tests.eval.test_suite import _fake_generate, _oracle

TOK = load_tokenizer("byte")
NIAH = [t for t in RULER_TASKS if t.startswith("niah")]
TWELVE = [t for t in RULER_TASKS if t != "qa_2"]
GARBAGE = " 1234567, I do not know."


@pytest.fixture(scope="module")
def ruler_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("ruler_data")
    write_qa_fixture(out)
    return out


def _quiet():
    return Console(file=io.StringIO(), width=200)


def _run(tasks, lengths, *, ruler_data=None, num_samples=1, **kw):
    return run_eval(None, TOK, tasks=list(tasks), lengths=list(lengths), num_samples=num_samples, seed=0,
                    batch_size=4, out_path=None, plots_dir=None, data_dir=None, device="cpu", ruler_data=ruler_data,
                    console=_quiet(), **kw)


class Recorder:
    """A fake `greedy_generate` answering with `answer_fn(prompt)`, recording each prompt's length."""

    def __init__(self, answer_fn):
        self.lengths: list[int] = []
        self._generate = _fake_generate(answer_fn)

    def __call__(self, model, prompts, max_new_tokens, **kw):
        self.lengths.extend(len(p) + max_new_tokens for p in prompts)  # the length each prompt was made for
        return self._generate(model, prompts, max_new_tokens, **kw)


# --- ruler_samples, suite_tasks, suite_mean, scorers, floors -----------------------------------------


def test_the_suite_has_13_tasks_with_ruler_budgets_and_scorers():
    assert list(RULER_TASKS) == ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1",
                                 "niah_multikey_2", "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt",
                                 "cwe", "fwe", "qa_1", "qa_2"]
    budgets = {t: spec.gen_tokens for t, spec in RULER_TASKS.items()}
    assert budgets == {**{t: 128 for t in NIAH}, "vt": 30, "cwe": 120, "fwe": 50, "qa_1": 32, "qa_2": 32}
    assert {t for t, spec in RULER_TASKS.items() if spec.match == "part"} == {"qa_1", "qa_2"}


@pytest.mark.parametrize("length", [2048, 4096])
def test_ruler_samples_makes_every_task_at_its_budget(ruler_data, length):
    haystack = NaturalHaystack(TOK)
    for task, spec in RULER_TASKS.items():
        samples = ruler_samples(task, TOK, length, 1, seed=0, haystack=haystack, data_dir=ruler_data)
        assert len(samples) == 1, task
        assert len(samples[0].prompt) == length - spec.gen_tokens, task
        assert samples[0].answers and all(isinstance(a, str) and a for a in samples[0].answers), task
        # the prompt ends where RULER's answer prefix ends, and its answer is in it (or, cwe/fwe, counted from it)
        text = TOK.decode(samples[0].prompt)
        if spec.family in ("niah", "vt", "qa"):
            assert any(a in text for a in samples[0].answers), task
    override = ruler_samples("qa_1", TOK, length, 1, seed=0, gen_tokens=10, data_dir=ruler_data)
    assert len(override[0].prompt) == length - 10


def test_ruler_samples_rejects_unknown_tasks_and_qa_without_data():
    with pytest.raises(ValueError, match=r"unknown RULER task 'niah_single_4'; choose one of niah_single_1, .*qa_2"):
        ruler_samples("niah_single_4", TOK, 2048, 1, seed=0)
    with pytest.raises(ValueError, match="unknown RULER task 'passkey'"):  # not one of RULER's 13
        ruler_samples("passkey", TOK, 2048, 1, seed=0)
    with pytest.raises(QADataMissing, match="--ruler-data"):
        ruler_samples("qa_2", TOK, 2048, 1, seed=0)


def test_suite_tasks_adds_qa_2_from_8k():
    for length in (512, 2048, 4096, 8191):
        assert suite_tasks(length) == tuple(TWELVE)
    for length in (8192, 16384):
        assert suite_tasks(length) == tuple(RULER_TASKS)
    assert len(suite_tasks(4096, qa2_from=4096)) == 13
    assert len(suite_tasks(2048, qa2_from=4096)) == 12
    assert len(suite_tasks(8192, qa2_from=16384)) == 12
    assert "qa_2" in suite_tasks(16384, qa2_from=16384)


def test_suite_mean_labels_what_it_covers():
    scores = {t: {"2048": 50.0, "4096": 30.0, "8192": 20.0} for t in TWELVE}  # qa_2 never ran
    scores["niah_single_1"]["2048"] = 100.0
    scores["cwe"].pop("4096")  # skipped at 4096
    scores["fwe"]["4096"] = None  # ran out of room: None
    scores["qa_2"] = {"2048": 0.0}  # not part of the suite below 8k: not averaged there
    means, coverage = suite_mean(scores, [2048, 4096, 8192, 16384])
    assert means == {"2048": round((100 + 11 * 50) / 12, 2), "4096": 30.0, "8192": 20.0}
    assert coverage["2048"] == {"tasks": 12, "of": 12, "missing": []}
    assert coverage["4096"] == {"tasks": 10, "of": 12, "missing": ["cwe", "fwe"]}
    assert coverage["8192"] == {"tasks": 12, "of": 13, "missing": ["qa_2"]}
    assert "16384" not in means and "16384" not in coverage  # nothing ran there: no mean
    # with qa_2 from 2048 on, the same scores cover 13 of 13 there
    means, coverage = suite_mean(scores, [2048], qa2_from=2048)
    assert coverage["2048"] == {"tasks": 13, "of": 13, "missing": []}
    assert means["2048"] == round((100 + 11 * 50 + 0) / 13, 2)


def test_scorers_qa_needs_one_answer_the_others_all():
    assert score_sample("qa_1", " Paris, I think", ["London", "paris"]) == 100.0  # any one answer is enough
    assert score_sample("qa_2", " Rome", ["London", "Paris"]) == 0.0
    assert score_sample("qa_1", " London and Paris", ["London", "Paris"]) == 100.0
    for task in [t for t in RULER_TASKS if t not in ("qa_1", "qa_2")]:
        assert score_sample(task, " 1111111 and 3333333", ["1111111", "2222222"]) == 50.0, task
        assert score_sample(task, " AAA BBB", ["aaa", "bbb"]) == 100.0, task  # case-insensitive
        assert score_sample(task, " nothing", ["aaa", "bbb"]) == 0.0, task


def _cwe_text(words: list[str]) -> str:
    listed = "\n".join(f"{i + 1}. {w}" for i, w in enumerate(words))
    return ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
            f"ones that appear most often.\n{listed}\nQuestion: What are the 10 most common words in the above "
            "list? Answer: The top 10 words that appear most often in the list are:")


def _fwe_text(coded: list[str]) -> str:
    return ("Read the following coded text and track the frequency of each coded word. Find the three most "
            f"frequently appeared coded words. {' '.join(coded)}\nQuestion: Do not provide any explanation. Please "
            "ignore the dots '....'. What are the three most frequently appeared words in the above coded text? "
            "Answer: According to the coded text above, the three most frequently appeared words are:")


def _qa_text(documents: list[str], query: str = "Who?") -> str:
    context = "\n\n".join(QA_DOCUMENT.format(i=i + 1, document=d) for i, d in enumerate(documents))
    return QA_TEMPLATE.format(context=context, query=query)


def test_sample_floor_of_hand_made_prompts():
    words = [a + b + "x" for a in "bcdfg" for b in "aeiou"]  # 25 distinct words
    listing = words * 3 + words[:10] * 2  # the 10 common words appear 5 times, the others 3
    top = words[:10]
    assert sample_floor("cwe", _cwe_text(listing), top) == pytest.approx(100 * 10 / 25)
    assert sample_floor("cwe", _cwe_text(words[:8] * 3), top) == pytest.approx(100 * 8 / 10)  # 8 listed, all drawn
    assert sample_floor("cwe", _cwe_text(words[:10] * 3), top) == 100.0  # no other words: drawing 10 finds them

    coded = ["qx"] + words[:12] * 2 + words[:3] * 4 + ["...", "...."]  # a cut first word, 12 coded words, dots
    assert sample_floor("fwe", _fwe_text(coded), words[:3]) == pytest.approx(100 * 3 / 12)

    docs = ["Paris is in France.", "Rome is in Italy.", "Madrid is in Spain.", "London is in England and "
            "paris is not."]
    assert sample_floor("qa_1", _qa_text(docs), ["Paris"]) == pytest.approx(50.0)  # case-insensitive, 2 of 4
    assert sample_floor("qa_2", _qa_text(docs), ["Berlin", "Rome"]) == pytest.approx(25.0)
    assert sample_floor("qa_1", _qa_text(docs), ["Oslo"]) == 0.0

    numbers = "The special magic number for a is: 1234567. Also 2345678 and 3456789 and 12345678."
    assert sample_floor("niah_single_2", numbers, ["1234567"]) == pytest.approx(100 / 3)  # 8 digits not counted
    with pytest.raises(ValueError, match="no floor for task 'passkey'"):
        sample_floor("passkey", numbers, ["12345"])


# --- run_eval with "ruler" ---------------------------------------------------------------------------


def test_an_oracle_scores_100_on_all_13_tasks_above_their_floors(ruler_data, monkeypatch):
    monkeypatch.setattr(decoding, "greedy_generate", _fake_generate(_oracle))
    results = _run(["ruler"], [2048], ruler_data=ruler_data)
    assert results["meta"]["tasks"] == list(RULER_TASKS)
    assert results["scores"] == {t: {"2048": 100.0} for t in RULER_TASKS}
    assert results["ruler_mean"] == {"2048": 100.0}
    assert results["ruler_mean_tasks"] == {"2048": {"tasks": 12, "of": 12, "missing": []}}
    assert results["notes"] == {} and results["skipped"] == {}
    assert summary_lines(results) == []

    floors = results["ruler_floor"]
    assert set(floors) == set(RULER_TASKS)
    assert all(0 <= floors[t]["2048"] <= 100 for t in RULER_TASKS)
    assert floors["cwe"]["2048"] < 100  # more distinct words listed than the 10 asked for
    for task in ("fwe", "niah_multikey_2", "niah_multikey_3", "qa_2"):  # many candidates of the answer's kind
        assert floors[task]["2048"] < 50, (task, floors[task])
    assert floors["niah_single_1"]["2048"] == 100.0  # the only number in a noise haystack: no retrieval test
    twelve = [floors[t]["2048"] for t in TWELVE]
    assert results["ruler_mean_floor"] == {"2048": round(sum(twelve) / 12, 2)}
    for task in RULER_TASKS:
        record = results["samples"][task]["2048"][0]
        assert record["score"] == 100.0 and record["floor"] == floors[task]["2048"], task
        assert record["prompt_tokens"] == 2048 - RULER_TASKS[task].gen_tokens, task


def test_without_ruler_data_the_suite_runs_11_tasks_and_says_so(monkeypatch):
    monkeypatch.setattr(decoding, "greedy_generate", _fake_generate(_oracle))
    console = _quiet()
    results = run_eval(None, TOK, tasks=["ruler"], lengths=[2048], num_samples=1, seed=0, batch_size=4,
                       out_path=None, plots_dir=None, data_dir=None, device="cpu", console=console)
    assert list(results["scores"]) == [t for t in RULER_TASKS if t not in ("qa_1", "qa_2")]
    assert len(results["scores"]) == 11
    note = results["notes"]["ruler"]
    assert "\n" not in note and "qa_1" in note and "qa_2" in note and "--ruler-data" in note
    assert "dev-v2.0.json" in note and "hotpot_dev_distractor_v1.json" in note
    assert note in console.file.getvalue().replace("\n", "")  # shown as the run starts
    assert results["ruler_mean"] == {"2048": 100.0}
    assert results["ruler_mean_tasks"] == {"2048": {"tasks": 11, "of": 12, "missing": ["qa_1"]}}
    lines = summary_lines(results)
    assert lines == ["RULER mean at 2048 averages 11 of the suite's 12 tasks (not the suite mean): missing qa_1", note]


def test_expand_tasks(ruler_data, tmp_path):
    assert expand_tasks(["ruler"], ruler_data) == (list(RULER_TASKS), None)
    assert expand_tasks(["ruler"], str(ruler_data)) == (list(RULER_TASKS), None)
    with pytest.raises(QADataMissing, match=f"{tmp_path}/dev-v2.0.json does not exist.*--ruler-data"):  # no files there
        expand_tasks(["ruler"], tmp_path)
    tasks, note = expand_tasks(["passkey", "niah_single_1", "ruler", "passkey"], None)
    assert tasks == ["passkey", *[t for t in RULER_TASKS if t not in ("qa_1", "qa_2")]]
    assert note.startswith("ruler: qa_1 and qa_2 left out")
    with pytest.raises(QADataMissing, match="dev-v2.0.json.*--ruler-data"):  # named on its own: an error
        expand_tasks(["qa_1"], None)
    with pytest.raises(QADataMissing, match="hotpot_dev_distractor_v1.json"):
        expand_tasks(["ruler", "qa_2"], None)


def test_a_wrong_model_scores_0_at_or_below_the_floor(ruler_data, monkeypatch):
    monkeypatch.setattr(decoding, "greedy_generate", _fake_generate(lambda prompt: GARBAGE))
    results = _run(["ruler"], [2048], ruler_data=ruler_data)
    assert results["scores"] == {t: {"2048": 0.0} for t in RULER_TASKS}
    assert results["ruler_mean"] == {"2048": 0.0}
    for task in RULER_TASKS:
        assert results["scores"][task]["2048"] <= results["ruler_floor"][task]["2048"], task
    assert results["ruler_mean"]["2048"] <= results["ruler_mean_floor"]["2048"]


STOP_TASKS = ["niah_single_1", "niah_single_2", "fwe"]


def test_stop_after_failure_skips_the_longer_lengths(monkeypatch):
    calls = Recorder(lambda prompt: GARBAGE)
    monkeypatch.setattr(decoding, "greedy_generate", calls)
    results = _run(STOP_TASKS, [4096, 1024, 2048], stop_after_failure=True)
    assert set(calls.lengths) == {1024}, "nothing generated after the failure"
    assert len(calls.lengths) == len(STOP_TASKS)
    for task in STOP_TASKS:
        assert results["scores"][task] == {"1024": 0.0, "2048": None, "4096": None}, task
        for n in ("2048", "4096"):
            assert "failed at 1024" in results["skipped"][task][n], (task, results["skipped"][task])
        assert "1024" not in results["skipped"][task]
    assert results["meta"]["stop_after_failure"] == 10.0
    assert failed_at(results, 1024, 10.0).startswith("failed at 1024: S-NIAH mean 0.0 < 10")
    assert any("at 4096 skipped" in line and "failed at 1024" in line for line in summary_lines(results))

    calls = Recorder(lambda prompt: GARBAGE)
    monkeypatch.setattr(decoding, "greedy_generate", calls)
    everything = _run(STOP_TASKS, [1024, 2048, 4096], stop_after_failure=False)
    assert sorted(set(calls.lengths)) == [1024, 2048, 4096]
    for task in STOP_TASKS:
        assert everything["scores"][task] == {"1024": 0.0, "2048": 0.0, "4096": 0.0}, task
    assert everything["skipped"] == {}


def test_stop_after_failure_reads_s_niah_only_and_stops_where_it_fails(monkeypatch):
    # fwe fails everywhere but the S-NIAH tasks pass: every length runs
    calls = Recorder(lambda p: GARBAGE if TOK.decode(p).endswith("words are:") else _oracle(p))
    monkeypatch.setattr(decoding, "greedy_generate", calls)
    results = _run(STOP_TASKS, [1024, 2048, 4096], stop_after_failure=True)
    assert results["scores"]["fwe"] == {"1024": 0.0, "2048": 0.0, "4096": 0.0}
    assert results["scores"]["niah_single_1"] == {"1024": 100.0, "2048": 100.0, "4096": 100.0}
    assert results["skipped"] == {}

    # S-NIAH passes at 1024 and fails from 2048 on: 2048 runs, 4096 does not
    calls = Recorder(lambda p: _oracle(p) if len(p) < 1024 else GARBAGE)
    monkeypatch.setattr(decoding, "greedy_generate", calls)
    results = _run(STOP_TASKS, [1024, 2048, 4096], stop_after_failure=True)
    assert sorted(set(calls.lengths)) == [1024, 2048]
    assert results["scores"]["niah_single_2"] == {"1024": 100.0, "2048": 0.0, "4096": None}
    assert "failed at 2048" in results["skipped"]["fwe"]["4096"]

    # a mean just at the threshold is not a failure: one of two S-NIAH tasks right (mean 50) with fail_below=50
    calls = Recorder(lambda p: _oracle(p) if "special magic number" in TOK.decode(p)[-200:] else GARBAGE)
    monkeypatch.setattr(decoding, "greedy_generate", calls)
    results = _run(["niah_single_1", "niah_single_3"], [1024, 2048], stop_after_failure=True, fail_below=50.0)
    assert results["scores"]["niah_single_1"] == {"1024": 100.0, "2048": 100.0}
    assert results["scores"]["niah_single_3"] == {"1024": 0.0, "2048": 0.0}
    assert results["skipped"] == {}


# --- the CLI ---------------------------------------------------------------------------------------


def test_cli_parses_the_suite_and_defaults_to_100_samples(monkeypatch, tmp_path):
    from fsframework.cli import app
    from fsframework.cli.eval import parse_tasks
    from fsframework.eval import runner

    assert parse_tasks("ruler") == ["ruler"]
    assert parse_tasks("ruler, passkey") == ["ruler", "passkey"]
    assert parse_tasks("qa_1,qa_2") == ["qa_1", "qa_2"]
    with pytest.raises(ValueError, match="unknown rulers"):
        parse_tasks("rulers")

    seen = []
    monkeypatch.setattr(runner, "evaluate_checkpoint", lambda checkpoint, **kw: seen.append(kw))
    cli = CliRunner()
    assert cli.invoke(app, ["eval", str(tmp_path), "--tasks", "ruler"]).exit_code == 0
    assert cli.invoke(app, ["eval", str(tmp_path), "--tasks", "passkey"]).exit_code == 0
    assert cli.invoke(app, ["eval", str(tmp_path), "--tasks", "ruler", "--num-samples", "3",
                            "--ruler-data", str(tmp_path), "--stop-after-failure"]).exit_code == 0
    assert [kw["num_samples"] for kw in seen] == [100, 10, 3]
    assert seen[0]["tasks"] == ["ruler"] and seen[0]["ruler_data"] is None and seen[0]["stop_after_failure"] is None
    assert seen[2]["ruler_data"] == tmp_path and seen[2]["stop_after_failure"] is True

    res = cli.invoke(app, ["eval", str(tmp_path), "--tasks", "ruler", "--ruler-data", str(tmp_path / "nowhere")])
    assert res.exit_code != 0 and "--ruler-data" in res.output and "not found" in res.output


def test_cli_qa_without_data_fails_in_one_line_before_the_model_loads(monkeypatch, tmp_path):
    from fsframework.cli import app
    from fsframework.eval import runner

    config = SimpleNamespace(eval=EvalConfig())  # eval.ruler_data unset
    monkeypatch.setattr(runner.Checkpoint, "open", staticmethod(lambda path: SimpleNamespace(
        config=lambda overrides: config)))

    def no_model(*args, **kwargs):
        raise AssertionError("the model must not load")

    monkeypatch.setattr(runner, "load_model", no_model)
    res = CliRunner().invoke(app, ["eval", str(tmp_path), "--tasks", "qa_1", "--lengths", "2048"],
                             env={"COLUMNS": "400"})
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1, res.output
    assert lines[0].startswith("error: qa_1 reads SQuAD v2.0 dev") and "dev-v2.0.json" in lines[0]
    assert "--ruler-data" in lines[0]
