"""`fsf generate` and its streaming generator: the cached tokens are the full forward pass's, and
bad input is refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from fsframework.cli import app
from fsframework.cli.common import EXIT_BAD_INPUT
from fsframework.config import load_config, to_yaml
from fsframework.data.tokenizers import ByteTokenizer
from fsframework.eval.decoding import greedy_generate
from fsframework.eval.generate import GenerationStats, next_token, stream_tokens
from fsframework.models.registry import build_model

runner = CliRunner()
TINY = ["model.vocab_size=260", "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.attention.window=16",
        "model.attention.cell_size=4", "model.attention.block_size=8", "model.attention.top_k=2",
        "model.attention.retained_cells=3", "model.attention.recent_cells=2", "model.attention.impl=reference",
        "data.seq_len=64", "data.tokenizer=byte"]


def _checkpoint(tmp_path, name: str):
    """A checkpoint directory as `fsf train` leaves one: config, fp32 weights, manifest."""
    cfg = load_config(None, [f"model.name={name}", *TINY])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    ckpt = tmp_path / "checkpoints" / "step_00000010"  # tmp_path is the run directory
    ckpt.mkdir(parents=True)
    (ckpt / "config.yaml").write_text(to_yaml(cfg))
    torch.save(model.state_dict(), ckpt / "model_fp32.pt")
    files = {p.name: p.stat().st_size for p in ckpt.iterdir()}
    (ckpt / "MANIFEST.json").write_text(json.dumps({"files": files}))
    return ckpt, model.eval()


@pytest.mark.parametrize("name,target", [("fsl", "checkpoint"), ("swa", "run")])
def test_greedy_generation_streams_the_full_forward_tokens(tmp_path, name, target):
    ckpt, model = _checkpoint(tmp_path, name)
    prompt = "def add(a, b):\n    return a + b\n\nprint(add("  # 40 bytes: past FS-L's first blocks
    path = ckpt if target == "checkpoint" else tmp_path
    res = runner.invoke(app, ["generate", str(path), "--prompt", prompt, "--greedy", "--max-new-tokens", "30"])
    assert res.exit_code == 0, res.output
    tok = ByteTokenizer()
    expected = greedy_generate(model, [tok.encode(prompt)], 30, eos_id=tok.eos_id, use_cache=False)[0]
    assert len(expected) == 30 and res.output.startswith(tok.decode(expected))
    assert "tokens/s" in res.output and "MiB" in res.output


def test_sampling_is_seeded_and_top_p_keeps_the_most_likely_token():
    torch.manual_seed(0)
    model = build_model(load_config(None, ["model.name=tfpp", *TINY]).model).eval()
    runs = [list(stream_tokens(model, [1, 2, 3], max_new_tokens=12, temperature=1.5, seed=s)) for s in (7, 7, 8)]
    assert runs[0] == runs[1] != runs[2]
    logits = torch.randn(4, 260)
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(next_token(logits, 1.0, 1e-6, gen), logits.argmax(dim=-1))
    stats = GenerationStats()
    assert len(list(stream_tokens(model, [5] * 20, max_new_tokens=6, stats=stats))) == 6
    assert stats.prompt_tokens == 20 and stats.steps == 5 and stats.cache_bytes > 0 and stats.tokens_per_s > 0


@pytest.mark.parametrize("args,message", [
    (["--prompt", ""], "the prompt is empty"),
    (["--prompt", "abc", "--temperature", "-0.5"], "--temperature must be >= 0"),
    (["--prompt", "abc", "--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--prompt", "abc", "--greedy", "--temperature", "0.7"], "contradict"),
    ([], "exactly one of --prompt"),
    (["--prompt", "x" * 60, "--max-new-tokens", "10"], "absolute positions trained up to data.seq_len=64"),
])
def test_bad_input_is_refused_by_name(tmp_path, args, message):
    ckpt, _ = _checkpoint(tmp_path, "sinusoidal")
    res = runner.invoke(app, ["generate", str(ckpt), *args])
    assert res.exit_code == EXIT_BAD_INPUT and message in " ".join(res.output.split()), res.output


def test_a_missing_prompt_file_is_bad_input(tmp_path):
    ckpt, _ = _checkpoint(tmp_path, "tfpp")
    res = runner.invoke(app, ["generate", str(ckpt), "--prompt-file", str(tmp_path / "none.txt")])
    assert res.exit_code == EXIT_BAD_INPUT and "none.txt: not found" in res.output
