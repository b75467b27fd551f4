"""The `mqar` task scores each queried value, split by the stacked windows' reach (docs/evaluation.md §4.6),
and runs end to end: `fsf train` on `data.source=mqar`, then `fsf eval --tasks mqar`."""

from __future__ import annotations

import json

import torch
from torch import nn

from fsframework.config import MqarConfig
from fsframework.eval.mqar import mqar_scores
from fsframework.eval.suite import run_eval
from tests.utils import REPO, TINY_MODEL, run_fsf

SPEC = MqarConfig(pairs=6, queries=6, keys=16, values=16, filler=8)
VOCAB = 48


class LookBack(nn.Module):
    """Predicts, at each position, the token that followed the latest earlier copy of the current
    token within `limit` positions back (an oracle for answers within its reach)."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*tokens.shape, VOCAB)
        for b in range(tokens.shape[0]):
            row = tokens[b].tolist()
            for i, token in enumerate(row):
                for j in range(i - 1, max(-1, i - self.limit - 1), -1):
                    if row[j] == token and j + 1 < i:
                        logits[b, i, row[j + 1]] = 1.0
                        break
        return logits


def test_an_oracle_within_its_reach_scores_exactly_the_within_split():
    full = mqar_scores(LookBack(10**6), SPEC, 200, 8, seed=0, batch_size=3, reach=40, device="cpu")
    assert full["score"] == full["within"] == full["beyond"] == 100.0
    assert full["within_n"] > 0 and full["beyond_n"] > 0 and full["within_n"] + full["beyond_n"] == 8 * 6
    short = mqar_scores(LookBack(41), SPEC, 200, 8, seed=0, batch_size=8, reach=40, device="cpu")
    assert short["within"] == 100.0 and short["beyond"] == 0.0
    assert abs(short["score"] - 100.0 * short["within_n"] / 48) < 1e-9


def test_suite_reports_mqar_with_its_splits(tmp_path):
    results = run_eval(LookBack(41), None, tasks=["mqar"], lengths=[100, 200], num_samples=4, seed=1, batch_size=4,
                       out_path=str(tmp_path / "scores.json"), plots_dir=None, data_dir=None, device="cpu",
                       mqar=SPEC, mqar_reach=40)
    assert set(results["scores"]["mqar"]) == {"100", "200"}
    assert results["breakdown"]["mqar"]["200"]["beyond"] == 0.0
    assert json.loads((tmp_path / "scores.json").read_text())["breakdown"]["mqar"]["200"]["reach"] == 40


def test_train_on_mqar_then_evaluate_it(tmp_path):
    run = tmp_path / "run"
    run_fsf("train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={run}", "data.source=mqar", "data.seq_len=64", "data.micro_batch_size=2",
            "data.mqar.pairs=4", "data.mqar.queries=4", *TINY_MODEL, "model.name=fs", "model.attention.window=16",
            "model.attention.block_size=16", "model.attention.cell_size=8", "model.attention.top_k=2",
            "train.max_steps=3", "train.ckpt_every=3", "optim.warmup_steps=1", "train.progress=false",
            "train.tensorboard=false")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(r["loss"] > 0 for r in records)
    out = run_fsf("eval", str(run), "--tasks", "mqar", "--lengths", "64,256", "--num-samples", "2")
    scores = json.loads((run / "eval" / "scores.json").read_text())
    assert set(scores["breakdown"]["mqar"]["256"]) >= {"within", "beyond", "within_n", "beyond_n"}
    assert scores["breakdown"]["mqar"]["256"]["reach"] == 32  # 2 layers x window 16
    assert "beyond reach" in out.stdout
