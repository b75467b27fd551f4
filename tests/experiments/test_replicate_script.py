"""`experiments/replicate_extrapolation.py` end to end at toy size: tokenizer, training, copy probe, table."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from types import SimpleNamespace

from tests.utils import REPO, run_fsf


def run_script(args: list[str], monkeypatch, capsys) -> str:
    """`python experiments/replicate_extrapolation.py ARGS` in this process, its `python -m
    fsframework` steps (tokenizer, training) run in-process too; returns what it printed.
    What the script computes is the test; the real `fsf` process is tested elsewhere."""

    def fsf_run(cmd, cwd=None, check=False):
        assert cmd[:3] == [sys.executable, "-m", "fsframework"], cmd
        proc = run_fsf(*cmd[3:], check=False)
        print(proc.stdout, end="")
        print(proc.stderr, end="", file=sys.stderr)
        if check and proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, cmd, proc.stdout, proc.stderr)
        return proc

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", ["replicate_extrapolation.py", *args])
    script = runpy.run_path(str(REPO / "experiments" / "replicate_extrapolation.py"))
    script["main"].__globals__["subprocess"] = SimpleNamespace(run=fsf_run)
    capsys.readouterr()
    script["main"]()
    return capsys.readouterr().out


def test_replication_script_trains_evaluates_and_writes_the_table(tmp_path, monkeypatch, capsys):
    tok = tmp_path / "bpe" / "tokenizer.json"
    cmd = ["--models", "tfpp,fsl", "--steps", "2",
           "--num-samples", "2", "--multiples", "1,2", "--out", str(tmp_path / "rep"),
           "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.vocab_size=512",
           f"data.tokenizer={tok}", f"data.cache_dir={tmp_path / 'data'}", "data.seq_len=128",
           "data.embedded_python_chars=60000", "data.embedded_retrieval_docs=40", "train.ckpt_every=2",
           "model.attention.window=32", "model.attention.block_size=32", "model.attention.retained_cells=4"]
    run_script(cmd, monkeypatch, capsys)
    assert tok.is_file()  # the BPE tokenizer was trained because it was missing
    summary = json.loads((tmp_path / "rep" / "table.json").read_text())
    assert summary["lengths"] == [128, 256] and set(summary["scores"]) == {"tfpp", "fsl"}
    for model in ("tfpp", "fsl"):
        assert set(summary["scores"][model]) == {"passkey", "niah_single_1"}
        probe = summary["copy_probe"][model]
        assert probe["first"] > 0 and probe["second"] > 0
    table = (tmp_path / "rep" / "table.md").read_text()
    assert "| fsl | passkey |" in table and "256 (2x)" in table
    # the needles beyond the reach of the stacked windows (2 layers x 32 tokens): at 256 tokens the
    # first of the 2 samples (its needle at depth 0, after the instruction line) is one of them
    far = summary["beyond_reach"]["fsl"]["passkey"]
    assert summary["window_reach"] == 64 and far["128"]["samples"] <= far["256"]["samples"]
    assert 0 < far["256"]["samples"] <= 2
    assert "Needles ending more than 64 tokens back" in table

    # another config, each model starting from the weights of the run above ('{model}' filled in)
    small = [a for a in cmd[cmd.index("model.d_model=32"):] if not a.startswith("model.attention")]
    again = ["--config", "experiments/yamls/replicate-extrapolation-128.yaml",
             "--models", "tfpp", "--steps", "1", "--num-samples", "2", "--multiples", "1",
             "--init-from", str(tmp_path / "rep" / "{model}"), "--out", str(tmp_path / "again"), *small]
    out = run_script(again, monkeypatch, capsys)
    assert f"initialised weights from {tmp_path / 'rep' / 'tfpp'}" in " ".join(out.split())  # rich wraps
    summary = json.loads((tmp_path / "again" / "table.json").read_text())
    assert summary["config"].endswith("replicate-extrapolation-128.yaml") and summary["lengths"] == [128]

    # the checkpoint carries its tokenizer: it still loads once the configured file is gone
    from fsframework.data.tokenizers import load_tokenizer
    from fsframework.checkpoints import load_model

    text = "The passkey is 12345."
    expected = load_tokenizer(str(tok)).encode(text)
    tok.unlink()
    _, cfg = load_model(tmp_path / "rep" / "tfpp")
    assert load_tokenizer(cfg.data.tokenizer).encode(text) == expected


def test_beyond_reach_scores_only_the_needles_the_windows_cannot_reach():
    script = runpy.run_path(str(REPO / "experiments" / "replicate_extrapolation.py"))
    rows = [{"needle_tokens_back": back, "score": score} for back, score in ((8, 100.0), (40, 0.0), (90, 100.0))]
    samples = {"passkey": {"128": rows}, "niah_single_1": {"128": rows[:1]}}
    beyond = script["beyond_reach"](samples, reach=32)
    assert beyond["passkey"]["128"] == {"score": 50.0, "samples": 2}  # the 8-tokens-back hit is left out
    assert beyond["niah_single_1"]["128"] == {"score": None, "samples": 0}
    text = script["markdown_beyond"]({"fs": beyond}, [128], 128, 32)
    assert "| fs | passkey | 50 (2) |" in text and "| fs | niah_single_1 | - |" in text
