"""The evaluation suite end to end: JSON, plots, table, and oracle / wrong-model scores."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import torch

from fsframework.config import ModelConfig
from fsframework.data.tokenizers import load_tokenizer
from fsframework.eval import decoding, suite
from fsframework.eval.perplexity import LengthScore
from fsframework.eval.qa_fixture import write_qa_fixture
from fsframework.eval.niah import NIAH_GEN_TOKENS
from fsframework.eval.suite import TASKS, UNPROMPTED, run_eval
from fsframework.models.registry import build_model

TOK = load_tokenizer("byte")
GENERATION_TASKS = [t for t in TASKS if t not in UNPROMPTED]  # scored from generated text


def _tiny_model():
    torch.manual_seed(0)
    return build_model(ModelConfig(name="tfpp", vocab_size=260, d_model=32, n_layers=2, n_heads=2))


def _run(model, tmp_path, tasks=GENERATION_TASKS, lengths=(1024, 2048), num_samples=2, **kw):
    # short generations keep the real-model runs fast on a CPU
    kw.setdefault("gen_tokens", {t: 1 if t == "ffact" else 2 for t in tasks})
    if "ruler_data" not in kw and {"qa_1", "qa_2", "ruler"} & set(tasks):
        kw["ruler_data"] = write_qa_fixture(tmp_path / "ruler_data")["qa_1"].parent
    return run_eval(model, TOK, tasks=list(tasks), lengths=list(lengths), num_samples=num_samples, seed=0,
                    batch_size=4,
                    out_path=str(tmp_path / "eval.json"), plots_dir=str(tmp_path / "plots"), data_dir=None,
                    device="cpu", **kw)


def test_run_eval_writes_json_and_plots(tmp_path):
    model = _tiny_model()
    tasks = ["niah_single_1", "niah_multikey_2", "passkey", "ffact"]
    results = _run(model, tmp_path, tasks=tasks, lengths=[1024, 512], num_samples=1)
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert saved["scores"] == results["scores"]
    assert set(saved["scores"]) == set(tasks)
    for task in tasks:
        assert set(saved["scores"][task]) == {"512", "1024"}
        assert all(0 <= v <= 100 for v in saved["scores"][task].values())
    assert set(saved["ruler_mean"]) == {"512", "1024"}
    assert len(saved["samples"]["niah_single_1"]["1024"]) == 1
    record = saved["samples"]["passkey"]["1024"][0]
    assert {"prediction", "answers", "score", "depth", "prompt_tokens"} <= set(record)
    assert record["prompt_tokens"] == 1024 - 2
    assert set(saved["breakdown"]["ffact"]["1024"]) == {"1", "2", "4", "8"}
    assert "1024/F=16" in saved["skipped"]["ffact"]  # 16 facts do not fit in 1024 bytes with the guard
    names = {p.name for p in (tmp_path / "plots").iterdir()}
    assert names == {"score_vs_length.png", "ruler_mean_vs_length.png", "passkey_depth_length.png",
                     "ffact_facts_length.png"}
    assert all((tmp_path / "plots" / n).read_bytes()[:4] == b"\x89PNG" for n in names)
    assert model.training, "the model's mode is restored"


def test_perplexity_task_calls_the_pinned_function(tmp_path, monkeypatch):
    calls = []

    def fake(model, tokenizer, lengths, *, data_dir, num_batches, batch_size, device):
        calls.append((lengths, data_dir, num_batches, batch_size, device))
        return {n: LengthScore(10.0 + n / 1024, 30.0, 3) if n < 1000 else LengthScore(float("nan"), float("nan"), 0)
                for n in lengths}

    monkeypatch.setattr(suite, "perplexity_vs_length", fake)
    results = run_eval(_tiny_model(), TOK, tasks=["perplexity"], lengths=[512, 256, 4096], num_samples=5, seed=0,
                       batch_size=2, out_path=None, plots_dir=str(tmp_path), data_dir="data/eval", device="cpu")
    assert calls == [([256, 512, 4096], "data/eval", 3, 2, "cpu")]
    assert results["scores"]["perplexity"] == {"256": 10.25, "512": 10.5, "4096": None}
    assert results["scores"]["perplexity_floor"] == {"256": 30.0, "512": 30.0, "4096": None}  # beside each score
    assert "4096" in results["skipped"]["perplexity"]
    assert (tmp_path / "perplexity_vs_length.png").is_file()


def test_task_names_and_arguments_are_validated(tmp_path):
    with pytest.raises(ValueError, match="allowed tasks: ruler, niah_single_1, .*qa_2, passkey, ffact, perplexity"):
        _run(None, tmp_path, tasks=["niah_single_9"])
    with pytest.raises(ValueError, match="needs data_dir"):
        _run(None, tmp_path, tasks=["perplexity"])


def _oracle(prompt: list[int]) -> str:
    """Reads the answer off the prompt the way a perfect reader would: finds the needles, follows
    the variable chain, counts the words, finds the completed sentence."""
    text = TOK.decode(prompt)
    if text.endswith("The passkey is"):
        return " " + re.search(r"The passkey is (\d{5})\.", text).group(1) + "."
    if text.endswith("they are: "):  # vt: follow the assignments from the asked value
        task = text[text.rfind("Memorize and track"):]
        names = {re.search(r"assigned the value (\d+) in the text above", task).group(1)}
        for line in re.findall(r"VAR (\w+) = (?:VAR )?(\w+)", task):
            if line[1] in names:
                names.add(line[0])
        return " " + " ".join(sorted(n for n in names if not n.isdigit()))
    if text.endswith("most often in the list are:"):  # cwe: the 10 most counted words of the last list
        words = re.findall(r"\d+\. ([a-z]+)", text[text.rfind("Below is a numbered list"):].split("\nQuestion")[0])
        return " " + " ".join(w for w, _ in Counter(words[1:]).most_common(10))
    if text.endswith("most frequently appeared words are:"):  # fwe: the 3 most counted coded words
        coded = text.split("coded words. ", 1)[1].split("\nQuestion")[0].split()[1:]
        return " " + " ".join(w for w, _ in Counter(w for w in coded if w != "...").most_common(3))
    if text.endswith("Answer:"):  # qa (the fixture's cloze questions): the word that follows in a document
        start = re.search(r'Question: Which word completes "(.*) \.\.\."', text).group(1)
        return " " + re.search(re.escape(start) + r"\s*([a-z]+)", text.split("\n\nAnswer the question")[0]).group(1)
    asked = re.findall(r"special magic \w+ for ([\w\-, ]+?)(?: mentioned in the provided text)?\?", text)[-1]
    keys = asked.replace(", and ", ", ").split(", ")
    values = [v for k in keys for v in re.findall(rf"special magic \w+ for {re.escape(k)} is: ([\w-]+)\.", text)]
    return " " + ", ".join(values) + "."


def _fake_generate(answer_fn):
    def generate(model, prompts, max_new_tokens, *, eos_id=None, batch_size=1, device=None, on_batch=None):
        if on_batch:
            on_batch(len(prompts))
        return [TOK.encode(answer_fn(p)) for p in prompts]

    return generate


def test_oracle_scores_100_and_wrong_model_scores_0(tmp_path, monkeypatch):
    monkeypatch.setattr(decoding, "greedy_generate", _fake_generate(_oracle))
    good = _run(None, tmp_path, lengths=[2048])
    assert set(good["scores"]) == set(GENERATION_TASKS)
    assert set(good["breakdown"]["ffact"]["2048"]) == {"1", "2", "4", "8", "16"}
    for task in GENERATION_TASKS:
        assert good["scores"][task] == {"2048": 100.0}, task
    assert good["ruler_mean"] == {"2048": 100.0}
    assert set(good["breakdown"]["passkey"]["2048"].values()) == {100.0}

    monkeypatch.setattr(decoding, "greedy_generate", _fake_generate(lambda p: " 1234567, I do not know."))
    bad = _run(None, tmp_path, lengths=[2048])
    for task in GENERATION_TASKS:
        assert bad["scores"][task] == {"2048": 0.0}, task


def test_short_lengths_are_skipped_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(decoding, "greedy_generate", _fake_generate(_oracle))
    results = _run(None, tmp_path, tasks=["niah_multivalue"], lengths=[256, 1024], gen_tokens=None)
    assert results["meta"]["gen_tokens"] == {"niah_multivalue": NIAH_GEN_TOKENS}
    assert results["scores"]["niah_multivalue"] == {"256": None, "1024": 100.0}
    assert "without any haystack" in results["skipped"]["niah_multivalue"]["256"]


class SuffixCopier(torch.nn.Module):
    """A language model that only copies: after the latest earlier occurrence of the longest
    suffix of its input, it predicts the token that followed. Pure induction, no learning."""

    def __init__(self, vocab: int, max_match: int = 64):
        super().__init__()
        self.vocab, self.max_match = vocab, max_match

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*tokens.shape, self.vocab)
        for b, row in enumerate(tokens.tolist()):
            best, best_len = None, 0
            for j in range(len(row) - 2, -1, -1):
                n = 0
                while n < self.max_match and n <= j and row[j - n] == row[len(row) - 1 - n]:
                    n += 1
                if n > best_len:
                    best, best_len = row[j + 1], n
            if best is not None:
                logits[b, -1, best] = 1.0
        return logits


def test_a_model_that_copies_finds_the_passkey_at_every_length_through_real_decoding(tmp_path):
    # the whole passkey path (prompt, greedy decoding, scoring) rewards copying: the zeros
    # of models that do not copy (README, length extrapolation) come from the models
    result = _run(SuffixCopier(TOK.vocab_size), tmp_path, tasks=["passkey"], lengths=[512, 2048], num_samples=3,
                  gen_tokens={"passkey": 8})
    assert result["scores"]["passkey"] == {"512": 100.0, "2048": 100.0}
