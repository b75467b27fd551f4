"""A user's own data end to end: `fsf data build` holds documents out (2% by default, filled to one
sample), and validation, `fsf eval` perplexity and the checks before training find (or name the option
that makes) that split."""

import json

import numpy as np
import pytest

from fsframework.data.build import DataBuildError, build_shards
from tests.utils import REPO, run_fsf

QUICKSTART = str(REPO / "yamls" / "quickstart.yaml")
TINY = ["data.seq_len=32", "data.micro_batch_size=2", "model.name=tfpp", "model.d_model=32", "model.n_layers=1",
        "model.n_heads=2", "train.progress=false", "train.tensorboard=false", "train.ckpt_every=100"]


def write_docs(path, count=120):
    # each document starts with its own number, so a sample tells which documents it came from
    rows = [json.dumps({"text": f"<{i}> " + f"document {i} says hello. " * (3 + i % 5)}) for i in range(count)]
    path.write_text("\n".join(rows) + "\n")
    return path


def document_numbers(split_dir):
    from streaming import StreamingDataset

    ds = StreamingDataset(local=str(split_dir), shuffle=False, batch_size=1)
    text = bytes(np.concatenate([ds[i]["tokens"] for i in range(ds.num_samples)]).clip(0, 255).astype(np.uint8))
    return {int(part.split(b">")[0]) for part in text.split(b"<")[1:] if part.split(b">")[0].isdigit()}


def test_held_out_documents_are_disjoint_seeded_and_counted(tmp_path):
    docs = write_docs(tmp_path / "docs.jsonl")
    stats = build_shards([str(docs)], tmp_path / "a", seq_len=32, eval_fraction=0.2, seed=3, verbose=False)
    assert (tmp_path / "a" / "train" / "index.json").is_file() and (tmp_path / "a" / "eval" / "index.json").is_file()
    train, held = document_numbers(tmp_path / "a" / "train"), document_numbers(tmp_path / "a" / "eval")
    assert held and not train & held and stats["eval_documents"] == 24  # 0.2 of 120
    build_shards([str(docs)], tmp_path / "b", seq_len=32, eval_fraction=0.2, seed=3, workers=2, verbose=False)
    assert document_numbers(tmp_path / "b" / "eval") == held  # the same draw with any number of workers
    build_shards([str(docs)], tmp_path / "c", seq_len=32, eval_fraction=0.2, seed=4, verbose=False)
    assert document_numbers(tmp_path / "c" / "eval") != held

    stats = build_shards([str(docs)], tmp_path / "d", seq_len=32, eval_docs=7, verbose=False)
    assert stats["eval_documents"] == 7
    recipe = json.loads((tmp_path / "d" / "build.json").read_text())["recipe"]
    assert recipe["eval_docs"] == 7 and recipe["tokenizer_identity"]["vocab_size"] == 257


@pytest.mark.parametrize("count, fraction, expected", [(30, 0.1, {3}), (30, 0.05, {1, 2}), (7, 0.5, {3, 4}),
                                                       (1000, 0.02, {20}), (30, 0.3, {9})])
def test_a_fraction_holds_out_its_expected_count_drawn_across_the_documents(count, fraction, expected):
    from collections import Counter

    from fsframework.data.build import HeldOutSplit

    chosen = Counter()
    for seed in range(300 if count <= 30 else 5):
        split = HeldOutSplit(fraction, 0, seed)
        kept = list(split.train_documents(iter(range(count))))
        assert len(split.held) in expected and sorted(kept + split.held) == list(range(count))
        chosen.update(split.held)
    if count <= 30:  # every document can be drawn, the first ones no more often than the rest
        assert len(chosen) == count and max(chosen.values()) < 3 * min(chosen.values())


def test_held_out_options_are_checked(tmp_path):
    docs = write_docs(tmp_path / "docs.jsonl", count=40)
    with pytest.raises(DataBuildError, match="not both"):
        build_shards([str(docs)], tmp_path / "x", seq_len=32, eval_fraction=0.1, eval_docs=3, verbose=False)
    with pytest.raises(DataBuildError, match="raise --eval-fraction or --eval-docs"):
        build_shards([str(docs)], tmp_path / "x", seq_len=200, eval_docs=1, verbose=False)
    # a fraction given is taken as given: the default's filling is the default's alone
    with pytest.raises(DataBuildError, match="raise --eval-fraction or --eval-docs"):
        build_shards([str(docs)], tmp_path / "x", seq_len=200, eval_fraction=0.02, verbose=False)
    assert not (tmp_path / "x").exists()
    proc = run_fsf("data", "build", str(docs), "--out", str(tmp_path / "x"), "--seq-len", "200", "--eval-fraction",
                   "0.02", check=False)
    assert proc.returncode == 2 and "raise --eval-fraction or --eval-docs" in proc.stderr
    assert not (tmp_path / "x").exists()


def split_invariants(split, kept, docs, fill):
    """Every document lands once, held-out ones in input order; under `fill` both sides hold a sample, or
    nothing is held out (whole documents: a corpus of more than two samples may still not split)."""
    assert sorted(int(d[0]) for d in kept + split.held) == [int(d[0]) for d in docs]
    assert [int(d[0]) for d in split.held] == sorted(int(d[0]) for d in split.held)
    if split.dropped:
        assert not split.held
    else:
        assert sum(len(d) + 1 for d in split.held) >= fill and sum(len(d) + 1 for d in kept) >= fill


@pytest.mark.parametrize("count", [1, 2, 5, 40, 400])
def test_the_default_split_fills_one_sample_or_holds_nothing_out(count):
    from fsframework.data.build import HeldOutSplit

    fill, outcomes = 65, set()
    for seed in range(100):
        rng = np.random.default_rng(seed)
        docs = [np.full(int(rng.integers(1, 60)), i) for i in range(count)]  # each document's tokens name it
        split = HeldOutSplit(0.02, 0, seed, fill_tokens=fill)
        kept = list(split.train_documents(iter(docs)))
        split_invariants(split, kept, docs, fill)
        # the fraction's own draw stays held out; filling only adds to it
        alone = HeldOutSplit(0.02, 0, seed)
        list(alone.train_documents(iter(docs)))
        drawn = {int(d[0]) for d in alone.held}
        assert split.dropped or drawn <= {int(d[0]) for d in split.held}
        if not split.dropped and sum(len(d) + 1 for d in alone.held) >= fill:
            assert split.filled == 0 and {int(d[0]) for d in split.held} == drawn
        outcomes.add("dropped" if split.dropped else "filled" if split.filled else "drawn")
    # documents of 2 to 61 tokens: one or two never fill a sample of 65 on each side; of 400, the 8 drawn do
    assert outcomes == {1: {"dropped"}, 2: {"dropped"}, 5: {"dropped", "filled"}, 40: {"filled"},
                        400: {"drawn"}}[count], outcomes


def test_the_default_holds_out_documents_of_a_small_corpus_or_says_there_are_too_few(tmp_path):
    docs = write_docs(tmp_path / "docs.jsonl")  # 120 documents, 15,180 tokens
    # 2% of 120 documents hold fewer than one sample of 257 tokens: more are held out, not an error
    stats = build_shards([str(docs)], tmp_path / "a", seq_len=256, seed=1, verbose=False)
    assert stats["eval_samples"] >= 1 and stats["eval_filled_documents"] >= 1 and stats["samples"] >= 1
    assert stats["eval_documents"] == stats["eval_filled_documents"] + 2
    train, held = document_numbers(tmp_path / "a" / "train"), document_numbers(tmp_path / "a" / "eval")
    assert held and not train & held and len(train | held) >= 115  # the partial last samples are dropped
    build_shards([str(docs)], tmp_path / "b", seq_len=256, seed=1, workers=2, verbose=False)
    assert document_numbers(tmp_path / "b" / "eval") == held  # deterministic, with any number of workers
    record = json.loads((tmp_path / "a" / "build.json").read_text())
    assert record["recipe"]["eval_default"] and record["recipe"]["eval_fraction"] == 0.02
    assert record["stats"]["eval_filled_documents"] == stats["eval_filled_documents"]

    # too few tokens for one sample held out and one trained on: no split, and a line says so
    proc = run_fsf("data", "build", str(docs), "--out", str(tmp_path / "c"), "--seq-len", "8000")
    lines = [line for line in proc.stdout.splitlines() if "no held-out split" in line]
    assert len(lines) == 1 and "--eval-fraction" in lines[0] and "more data" in lines[0], proc.stdout
    assert (tmp_path / "c" / "index.json").is_file() and not (tmp_path / "c" / "train").exists()
    assert not (tmp_path / "c" / "eval").exists()
    record = json.loads((tmp_path / "c" / "build.json").read_text())
    assert record["stats"]["samples"] == 1 and "eval_documents" not in record["stats"]
    assert record["stats"]["no_eval_split"] == lines[0]


def test_own_data_trains_with_validation_and_evaluates(tmp_path):
    # the default build: 2% of the documents held out, which validation and perplexity read
    docs = write_docs(tmp_path / "docs.jsonl", count=300)
    run_fsf("data", "build", str(docs), "--out", str(tmp_path / "shards"), "--seq-len", "32")
    stats = json.loads((tmp_path / "shards" / "build.json").read_text())["stats"]
    assert stats["eval_documents"] == 6 and stats["eval_filled_documents"] == 0  # 2% of 300
    held = document_numbers(tmp_path / "shards" / "eval")
    assert len(held) == 6 and not held & document_numbers(tmp_path / "shards" / "train")
    build_shards([str(docs)], tmp_path / "explicit", seq_len=32, eval_fraction=0.02, verbose=False)
    assert document_numbers(tmp_path / "explicit" / "eval") == held  # the draw of --eval-fraction 0.02
    run = tmp_path / "run"
    run_fsf("train", QUICKSTART, f"run_dir={run}", "data.source=shards", f"data.path={tmp_path / 'shards'}", *TINY,
            "train.max_steps=4", "train.eval_every=2", "train.eval_batches=1")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("val/loss" in r for r in records)
    proc = run_fsf("eval", str(run), "--tasks", "perplexity", "--lengths", "32", "--num-samples", "1")
    scores = json.loads((run / "eval" / "scores.json").read_text())
    assert scores["scores"]["perplexity"], proc.stdout


def test_a_dataset_without_held_out_split_is_named_before_any_work(tmp_path):
    run_fsf("data", "build", str(write_docs(tmp_path / "docs.jsonl")), "--out", str(tmp_path / "shards"),
            "--seq-len", "32", "--eval-fraction", "0")
    # an explicit 0 holds nothing out: the shards are the output directory itself
    assert sorted(p.name for p in (tmp_path / "shards").iterdir() if not p.name.startswith("shard.")) == [
        "build.json", "index.json"]
    recipe = json.loads((tmp_path / "shards" / "build.json").read_text())["recipe"]
    assert recipe["eval_fraction"] == 0 and not recipe["eval_default"]
    source = ("data.source=shards", f"data.path={tmp_path / 'shards'}")
    for command, extra in (("train", ["train.eval_every=2"]), ("run", [])):
        run = tmp_path / f"run_{command}"
        proc = run_fsf(command, QUICKSTART, f"run_dir={run}", *source, *TINY, "train.max_steps=2", *extra, check=False)
        assert proc.returncode == 2, proc.stderr
        assert "--eval-fraction" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert not run.exists()
    run = tmp_path / "run"
    run_fsf("train", QUICKSTART, f"run_dir={run}", *source, *TINY, "train.max_steps=2")
    proc = run_fsf("eval", str(run), "--tasks", "perplexity", "--lengths", "32", check=False)
    assert proc.returncode == 2 and "--eval-fraction" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_sequence_length_other_than_the_shards_is_refused_before_any_work(tmp_path):
    run_fsf("data", "build", str(write_docs(tmp_path / "docs.jsonl")), "--out", str(tmp_path / "shards"),
            "--seq-len", "32")
    run = tmp_path / "run"
    proc = run_fsf("train", QUICKSTART, f"run_dir={run}", "data.source=shards", f"data.path={tmp_path / 'shards'}",
                   *TINY, "data.seq_len=64", "train.max_steps=2", check=False)
    assert proc.returncode == 2 and not run.exists(), proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "holds samples of 32 tokens" in lines[0] and "not data.seq_len=64" in lines[0]


def test_tokenizer_mismatch_is_refused_before_any_work(tmp_path):
    from fsframework.data.tokenizers import train_bpe_tokenizer

    tok = tmp_path / "tok.json"
    train_bpe_tokenizer([f"some text number {i} and more words" for i in range(200)], 400, tok)
    run_fsf("data", "build", str(write_docs(tmp_path / "docs.jsonl")), "--out", str(tmp_path / "shards"),
            "--seq-len", "32")
    source = ("data.source=shards", f"data.path={tmp_path / 'shards'}")
    run = tmp_path / "run"
    proc = run_fsf("train", QUICKSTART, f"run_dir={run}", *source, *TINY, f"data.tokenizer={tok}",
                   "model.vocab_size=260", "train.max_steps=2", check=False)
    assert proc.returncode == 2 and "model.vocab_size=" in proc.stderr and not run.exists(), proc.stderr
    proc = run_fsf("train", QUICKSTART, f"run_dir={run}", *source, *TINY, f"data.tokenizer={tok}",
                   "model.vocab_size=512", "train.max_steps=2", check=False)
    assert proc.returncode == 2 and "was built with tokenizer byte" in proc.stderr and not run.exists(), proc.stderr
