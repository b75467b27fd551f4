"""AR-GRC through the same paths as every model: `fsf train` (checkpoints, resume) and
`fsf eval` perplexity, with the model-wide dropout on."""

from __future__ import annotations

import json

from tests.utils import REPO, TINY_DATA, run_fsf

ARGRC_TINY = ["model.name=argrc", "model.d_model=24", "model.argrc.d_state=16", "model.argrc.post_embed_mlp_hidden=32",
              "model.tie_embeddings=true", "model.dropout=0.1", "train.progress=false", "train.tensorboard=false",
              "optim.warmup_steps=1"]


def test_train_resume_and_evaluate(tmp_path, data_cache):
    run = tmp_path / "argrc"
    common = [f"run_dir={run}", f"data.cache_dir={data_cache}", *TINY_DATA, *ARGRC_TINY, "train.max_steps=3",
              "train.ckpt_every=2"]
    proc = run_fsf("train", str(REPO / "yamls/argrc-wt2.yaml"), *common, "train.stop_at_step=2",
                   "data.source=embedded", "data.tokenizer=byte", "model.vocab_size=260")
    assert "model argrc" in proc.stdout
    run_fsf("train", str(REPO / "yamls/argrc-wt2.yaml"), *common, "data.source=embedded", "data.tokenizer=byte",
            "model.vocab_size=260")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    out = tmp_path / "scores.json"
    run_fsf("eval", str(run), "--tasks", "perplexity", "--lengths", "32,96", "--num-samples", "2", "--out", str(out))
    perplexity = json.loads(out.read_text())["scores"]["perplexity"]
    assert set(perplexity) == {"32", "96"}
    assert all(1.0 < value < 300.0 for value in perplexity.values()), perplexity  # finite, about uniform (3 steps)


def test_validation_perplexity_and_early_stopping(tmp_path, data_cache):
    """Shared by every model: evaluations every step; a learning rate too small to change the
    weights makes no evaluation an improvement, so patience 2 stops the run at step 3 of 6."""
    run = tmp_path / "stop"
    args = [str(REPO / "yamls/argrc-wt2.yaml"), f"run_dir={run}", f"data.cache_dir={data_cache}", *TINY_DATA,
            *ARGRC_TINY, "data.source=embedded", "data.tokenizer=byte", "model.vocab_size=260", "model.dropout=0.0",
            "train.max_steps=6", "train.ckpt_every=6", "train.eval_every=1", "train.eval_batches=2",
            "train.early_stop_patience=2", "optim.lr=1e-30"]
    proc = run_fsf("train", *args)
    assert "early stop at step 3" in proc.stdout
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["val/ppl"] > 1.0 and r["val/loss"] > 0.0 for r in records)
    assert (run / "checkpoints" / "step_00000003").is_dir()
    again = run_fsf("train", *args)  # resuming a run that stopped early trains no further
    assert "early stop" not in again.stdout
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3


def test_eval_lengths_take_the_papers_range():
    import pytest

    from fsframework.cli.eval import parse_lengths

    assert parse_lengths("32:2976:128") == list(range(32, 2977, 128)) and parse_lengths("32:2976:128")[-1] == 2976
    assert parse_lengths("64, 100:300:100") == [64, 100, 200, 300]
    for bad in ("12:a", "300:100:10", "0", "5:9"):
        with pytest.raises(ValueError, match="--lengths"):
            parse_lengths(bad)
