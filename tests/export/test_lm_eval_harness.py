"""lm-evaluation-harness runs on an export as documented (docs/export.md): the `hf` model, with
`trust_remote_code` for every kind but tfpp (a native Llama), offline, on a small local task
(a task YAML over a local jsonl file). Its log-likelihoods are the ones fsframework computes."""

from __future__ import annotations

import json

import pytest
import torch

from fsframework.checkpoints import load_model
from fsframework.export import export_checkpoint
from tests.export.helpers import random_checkpoint

lm_eval = pytest.importorskip("lm_eval")  # a dev dependency (pyproject.toml)

DOCS = [{"question": "The cat sat on the", "choices": ["mat", "moon"], "label": 0},
        {"question": "One, two, three,", "choices": ["four", "blue"], "label": 0},
        {"question": "Grüße aus", "choices": ["Berlin", "42"], "label": 0}]


def write_local_task(folder, name="fsf_local_choice"):
    """A multiple-choice task over a local jsonl file: what a user writes for their own data."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "local.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: \"{{question}}\"\ndoc_to_choice: \"{{choices}}\"\n"
        "doc_to_target: \"{{label}}\"\nmetric_list:\n  - metric: acc\n")
    return name


def our_loglikelihood(model, context: str, continuation: str) -> float:
    ids = list((context + continuation).encode("utf-8"))  # the byte tokenizer: byte b is token b
    start = len(context.encode("utf-8"))
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids[:-1]])).float(), dim=-1)[0]
    return sum(float(logp[i - 1, ids[i]]) for i in range(start, len(ids)))


# tfpp: native Llama code; argrc: remote code for a model without attention. FS goes through the
# harness in the `fsf eval --harness` test below; every kind's export under transformers' own
# generate and logits is tested in test_export_generate.py / test_export_transformers.py
@pytest.mark.parametrize("kind", ["tfpp", "argrc"])
def test_lm_eval_harness_on_an_export(kind, tmp_path, monkeypatch):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "out"
    export_checkpoint(random_checkpoint(tmp_path / "run", kind), out)
    task = write_local_task(tmp_path / "tasks")
    remote = "" if kind == "tfpp" else ",trust_remote_code=True"
    results = simple_evaluate(model="hf", model_args=f"pretrained={out},dtype=float32{remote}", tasks=[task],
                              task_manager=TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False),
                              device="cpu",
                              batch_size=1, log_samples=True)
    ours, _ = load_model(out)
    samples = results["samples"][task]
    assert len(samples) == len(DOCS)
    correct = 0
    for sample in samples:
        doc = sample["doc"]
        theirs = [resp[0][0] for resp in sample["resps"]]
        # the harness scores the choice after its target delimiter, a space
        mine = [our_loglikelihood(ours, doc["question"], " " + choice) for choice in doc["choices"]]
        assert theirs == pytest.approx(mine, abs=1e-3)
        correct += int(max(range(len(mine)), key=mine.__getitem__) == doc["label"])
    assert results["results"][task]["acc,none"] == pytest.approx(correct / len(DOCS))


def test_fsf_eval_harness_exports_and_runs_it(tmp_path, monkeypatch):
    from tests.utils import run_fsf

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = random_checkpoint(tmp_path / "run", "fs")
    task = write_local_task(tmp_path / "tasks")
    # the built-in index (half a minute to build) stands empty: a task found neither there nor
    # in the user's folder is named in one line, before anything is exported or written
    import lm_eval.tasks

    real_manager = lm_eval.tasks.TaskManager
    monkeypatch.setattr(lm_eval.tasks, "TaskManager",
                        lambda include_path=None, include_defaults=True: real_manager(
                            include_path=include_path or str(tmp_path / "tasks"), include_defaults=False))
    proc = run_fsf("eval", str(run), "--harness", "no_such_task", "--harness-include", str(tmp_path / "tasks"),
                   check=False)
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", real_manager)
    assert proc.returncode == 2 and "unknown task no_such_task" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (run / "eval").exists()

    proc = run_fsf("eval", str(run), "--harness", task, "--harness-include", str(tmp_path / "tasks"))
    results = json.loads((run / "eval" / "harness.json").read_text())["results"][task]
    ours, _ = load_model(run)
    correct = sum(max(range(2), key=lambda c: our_loglikelihood(ours, d["question"], " " + d["choices"][c]))
                  == d["label"] for d in DOCS)
    assert results["acc,none"] == pytest.approx(correct / len(DOCS))
    assert f"{task}: acc" in proc.stdout
