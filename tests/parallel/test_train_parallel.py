"""End to end through the CLI under torchrun: SP and DP runs reproduce single-process losses,
ZeRO-3 + SP resumes exactly and its checkpoint evaluates, a failing rank is named."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.parallel.cli_runs import STEPS, assert_close, launch, losses, rewind, torchrun, train_args
from tests.parallel.probed_fsf import PROBE_ENV, probe_batch
from tests.utils import run_fsf

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(300)]
# SP + ZeRO-3 runs recompute their blocks, and their output head chunk by chunk (`train.loss_chunk`), in
# backward: their losses still equal the single process's, which keeps its whole logits
SP2_ZERO3 = ["parallel.sp=2", "parallel.zero_stage=3", "train.activation_checkpointing=true", "train.loss_chunk=24"]


@pytest.fixture(scope="module")
def single(tmp_path_factory, data_cache) -> Path:
    run_dir = tmp_path_factory.mktemp("single")
    run_fsf(*train_args(run_dir, data_cache))
    return run_dir


@pytest.fixture(scope="module")
def sp_zero3(tmp_path_factory, data_cache) -> Path:
    run_dir = tmp_path_factory.mktemp("sp2_zero3")
    torchrun(2, *train_args(run_dir, data_cache, *SP2_ZERO3))
    return run_dir


def test_sp2_zero3_losses_equal_single_process(single, sp_zero3):
    assert_close(losses(sp_zero3), losses(single))
    # one DP replica: the token count is that of the single-process run
    assert json.loads((sp_zero3 / "metrics.jsonl").read_text().splitlines()[-1])["tokens"] == STEPS * 2 * 64
    # the whole model's FLOPs per token, whichever ranks share a row (TFLOP/s divides by every device)
    flops = [[json.loads(line)["flops_per_token"] for line in (run / "metrics.jsonl").read_text().splitlines()]
             for run in (single, sp_zero3)]
    assert flops[0] == flops[1] and flops[0][0] > 0
    # the time in the sequence-parallel exchanges, a part of forward and backward; none on one process,
    # and no gradient reduction share under ZeRO-3 (its hooks reduce during the backward)
    for record in map(json.loads, (sp_zero3 / "metrics.jsonl").read_text().splitlines()):
        assert 0 < record["collectives_share"] < record["compute_share"] and "grad_reduce_share" not in record
    assert not any("collectives_share" in line for line in (single / "metrics.jsonl").read_text().splitlines())
    # every logged step names the busiest of the two ranks (fsframework.train.stragglers); one process has none
    for record in map(json.loads, (sp_zero3 / "metrics.jsonl").read_text().splitlines()):
        assert 0 < record["rank_busy_s_min"] <= record["rank_busy_s_max"] and record["rank_slowest"] in (0, 1)
    assert not any("rank_slowest" in line for line in (single / "metrics.jsonl").read_text().splitlines())


@pytest.fixture(scope="module")
def resumed_at_3(sp_zero3, tmp_path_factory, data_cache) -> tuple[Path, subprocess.CompletedProcess, dict]:
    """The straight run's step-3 checkpoint (what a run stopped at step 3 writes: a stop and a resume on
    one rank are tests/train/test_resume.py's) resumed on 2 ranks to step 6, by `fsf train`; the
    engine's own loss on a probe batch right after it resumed (tests/parallel/probed_fsf.py)."""
    run_dir = rewind(sp_zero3, tmp_path_factory.mktemp("resumed") / "split", 3)
    probe = run_dir.parent / "engine_loss.json"
    proc = torchrun(2, *train_args(run_dir, data_cache, *SP2_ZERO3), env={PROBE_ENV: str(probe)},
                    module="tests.parallel.probed_fsf")
    return run_dir, proc, json.loads(probe.read_text())


def test_a_rank_killed_under_sp2_zero3_restarts_to_the_same_losses(sp_zero3, tmp_path, data_cache):
    """`fsf launch --max-restarts 1` of the SP 2 + ZeRO-3 job: rank 1 SIGKILLed after step 4 (after
    checkpoint 3), the job starts again from checkpoint 3, and its losses are the uninterrupted run's,
    exactly (the data-parallel ZeRO-2 case: tests/parallel/test_resume_resize.py)."""
    from fsframework.train.restarts import KILL_ENV

    run_dir = tmp_path / "killed"
    proc = launch(2, *train_args(run_dir, data_cache, *SP2_ZERO3), options=("--max-restarts", "1"),
                  env={KILL_ENV: "1:4"})
    assert "restart 1 of 1: rank 1 was killed by SIGKILL" in proc.stdout
    assert "resumed from step_00000003 at step 3" in proc.stdout
    assert losses(run_dir) == losses(sp_zero3)


def test_sp2_zero3_resume_is_exact(sp_zero3, resumed_at_3):
    run_dir, proc, _ = resumed_at_3
    assert (run_dir / "checkpoints" / "step_00000003" / "client_rank1.pt").is_file()
    assert "resumed from step_00000003" in proc.stdout
    assert losses(run_dir) == losses(sp_zero3)  # steps 4-6 as the straight run's
    # the libraries' messages that say nothing here are filtered (fsframework.quiet): torch's
    # deprecation of the collectives ZeRO-3 calls, DeepSpeed's "untested optimizer", streaming's
    # "resume training from the wrong sample" of a replicated (SP) dataset: exact, as just checked
    log = proc.stdout + proc.stderr
    assert not [line for line in log.splitlines()
                if "FutureWarning" in line or "untested optimizer" in line or "wrong sample" in line], log


def test_sp2_zero3_checkpoint_consolidates_to_the_engines_own_weights(sp_zero3, resumed_at_3, tmp_path):
    """The weights merged from the ZeRO-3 shards give the loss the DeepSpeed engine itself
    computes after resuming the same checkpoint on 2 ranks; the written fp32 file holds them."""
    import torch

    from fsframework.checkpoints import consolidated_state_dict, read_config, write_fp32_model
    from fsframework.models.losses import lm_losses
    from fsframework.models.registry import build_model

    engine = resumed_at_3[2]
    assert engine["checkpoint"] == "step_00000003"
    checkpoint = sp_zero3 / "checkpoints" / "step_00000003"
    merged = consolidated_state_dict(checkpoint)  # from the ZeRO-3 shards
    model = build_model(read_config(sp_zero3 / "config.yaml").model)
    model.load_state_dict(merged)
    tokens = probe_batch(model.cfg.vocab_size)
    with torch.no_grad():
        loss = lm_losses(model(tokens[:, :-1]), tokens[:, 1:])[0].item()
    assert abs(loss - engine["loss"]) <= 1e-5 * abs(engine["loss"]), (loss, engine["loss"])
    untrained = build_model(model.cfg)
    with torch.no_grad():
        assert abs(lm_losses(untrained(tokens[:, :-1]), tokens[:, 1:])[0].item() - engine["loss"]) > 1e-3  # it can fail

    out = write_fp32_model(checkpoint)  # which `fsf eval` then reads
    written = torch.load(out, weights_only=True)
    assert written.keys() == merged.keys() and all(torch.equal(written[k], merged[k]) for k in merged)
    scores_path = tmp_path / "scores.json"
    run_fsf("eval", str(checkpoint), "--tasks", "perplexity", "--lengths", "64", "--num-samples", "2",
            "--out", str(scores_path))
    assert "64" in json.loads(scores_path.read_text())["scores"]["perplexity"]


def test_a_failing_rank_ends_the_job_with_a_message_naming_it(tmp_path, data_cache):
    run_dir = tmp_path / "fail"
    proc = torchrun(2, *train_args(run_dir, data_cache, "parallel.sp=2", "parallel.timeout_s=30"),
                    env={"FSF_FAULT": "raise:1:2"}, check=False, module="tests.faults")
    assert proc.returncode != 0
    assert "rank 1: injected fault at step 2" in proc.stderr + proc.stdout


def test_a_stopped_rank_is_named_by_the_health_check(tmp_path, data_cache):
    # rank 1 is frozen (SIGSTOP) inside step 2: rank 0's collective times out after parallel.timeout_s,
    # the monitored barrier finds rank 1 missing, and the job ends instead of hanging, through
    # fsf launch's agent, which continues the stopped rank so that its SIGTERM acts at once
    import time

    from fsframework.launcher.plan import agent_command

    run_dir = tmp_path / "stopped"
    started = time.monotonic()
    proc = torchrun(2, *train_args(run_dir, data_cache, "parallel.sp=2", "parallel.timeout_s=10"),
                    env={"FSF_FAULT": "stop:1:2"}, check=False, module="tests.faults", agent=agent_command())
    assert proc.returncode != 0 and time.monotonic() - started < 50  # not the agent's 30 s kill on top (~57 s)
    out = proc.stderr + proc.stdout
    assert "rank 0 of 2: a collective in step 2 failed or timed out after parallel.timeout_s=10s" in out
    assert "Ranks 1 failed to pass monitoredBarrier" in out
    assert "MarkupError" not in out  # the error text (with gloo's bracketed source paths) prints as is


def test_argrc_sp2_zero3_losses_equal_single_process(tmp_path, data_cache):
    # AR-GRC's own sequence-parallel form (ranks exchange block roots) under ZeRO-3 and torchrun: the
    # two ranks' slices ([0, 32) and [32, 63)) apply the cell different numbers of times, so ZeRO-3
    # must gather the cell's weights once per scan (a leaf module), not once per application; with
    # activation checkpointing the recomputed cells run inside the same gathered scan; the tied head
    # runs in chunks (SP2_ZERO3's train.loss_chunk), gathered again for each chunk's recomputation
    argrc = ["model.name=argrc", "model.argrc.d_state=24", "model.tie_embeddings=true"]
    single_run, sp_run = tmp_path / "argrc_single", tmp_path / "argrc_sp2"
    run_fsf(*train_args(single_run, data_cache, *argrc))
    torchrun(2, *train_args(sp_run, data_cache, *argrc, *SP2_ZERO3))  # cells recomputed in backward too
    assert_close(losses(sp_run), losses(single_run))


def test_document_masking_on_two_zero3_ranks_equals_one_rank(tmp_path):
    """Packed documents read apart (docs/training.md, "Documents") under ZeRO-3 with activation
    checkpointing on 2 ranks, data parallel and sequence parallel: the losses of one rank accumulating
    the same 2 micro-batches. A corpus of its own whose retrieval documents are shorter than a row, so
    rows hold several; under SP the second rank continues the document over the ranks' boundary (input
    position 32) from the first rank's halo (fsframework/parallel/documents.py), in most rows a document
    that began at the row's start, in about one row of 11 one that began inside the row (micro-batches
    of 8 rows: the 96 rows read hold some). The SP run takes the zigzag layout, which deals each batch's
    four blocks to the ranks by the documents' work (`document_runs`): a rank's late run continues documents
    from the other rank's runs and from its own early run, by point-to-point messages both ways."""
    masked = ["data.document_masking=true", "data.embedded_retrieval_docs=400", "data.embedded_python_chars=20000",
              "data.embedded_retrieval_max_fraction=0.6", "data.micro_batch_size=8",
              # a window and cells small enough that a continued piece routes over other ranks' cells from
              # their summaries and receives the selected ones (fsframework/parallel/document_selected.py)
              "model.attention.window=16", "model.attention.cell_size=4"]
    one, two, sp, cache = tmp_path / "one", tmp_path / "two", tmp_path / "sp", str(tmp_path / "cache")
    run_fsf(*train_args(one, cache, "parallel.grad_accum=2", *masked))
    torchrun(2, *train_args(two, cache, "parallel.zero_stage=3", "train.activation_checkpointing=true", *masked))
    assert_close(losses(two), losses(one))
    records = [json.loads(line) for line in (one / "metrics.jsonl").read_text().splitlines()]
    assert max(r["documents_per_row"] for r in records) > 1  # rows that held several documents were read apart
    # FS's layers and the tied head recompute in backward (the halo exchange with them)
    torchrun(2, *train_args(sp, cache, *SP2_ZERO3, "parallel.grad_accum=2", "parallel.sp_layout=zigzag", *masked))
    assert_close(losses(sp), losses(one))
    crossing, begun_inside = _rows_crossing(Path(cache), 32)
    assert crossing > 0.9 and begun_inside > 0.05, (crossing, begun_inside)


def _rows_crossing(cache: Path, boundary: int) -> tuple[float, float]:
    """The fractions of the training rows in `cache` whose document at `boundary` began before it, and
    began inside the row (after its first token)."""
    from fsframework.data.inspect_shards import read_shard

    index = next(cache.rglob("train/index.json"))
    rows = [sample["doc_ids"] for shard in json.loads(index.read_text())["shards"]
            for sample in read_shard(index.parent, shard)]
    crossing = [row for row in rows if row[boundary - 1] == row[boundary]]
    return len(crossing) / len(rows), sum(int(row[0] != row[boundary]) for row in crossing) / len(rows)
