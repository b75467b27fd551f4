"""A run's hyperparameters in tensorboard's HPARAMS tab: one row per run directory (a resume
included), its kind's own settings, its scalars' last values as the metric columns."""

from __future__ import annotations

import json

import pytest

from fsframework.config import load_config
from fsframework.train.hparams import run_hparams
from tests.utils import REPO, TINY_DATA, TINY_MODEL, run_fsf


def test_each_kind_lists_the_settings_it_reads():
    def keys(kind: str, *overrides: str) -> dict:
        return run_hparams(load_config(REPO / "yamls" / "quickstart.yaml", [f"model.name={kind}", *overrides]), 4)

    fs, fsl, tfpp = keys("fs"), keys("fsl"), keys("tfpp")
    assert fs["model.attention.cell_size"] == 16 and "model.attention.retained_cells" not in fs
    assert fsl["model.attention.retained_cells"] == 8 and fsl["model.attention.top_k"] == 4
    assert not any(key.startswith("model.attention.") for key in tfpp)
    assert keys("swa")["model.attention.window"] == 128 and "model.argrc.d_state" in keys("argrc")
    # 8 sequences a micro-batch, 2 micro-batches, 4 ranks of which pairs share a row: 2 data-parallel
    sp = keys("tfpp", "parallel.sp=2", "parallel.grad_accum=2")
    assert (sp["batch.sequences"], sp["batch.tokens"], sp["parallel.world_size"]) == (32, 32 * 512, 4)
    assert tfpp["data.document_masking"] == "false" and all(isinstance(v, (int, float, str)) for v in tfpp.values())


def hparams_table(logdir):
    """The HPARAMS tab's rows as tensorboard's plugin computes them: {session: (hparams, {metric: value})}."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import api_pb2, backend_context, list_session_groups

    events = plugin_event_multiplexer.EventMultiplexer()
    events.AddRunsFromDirectory(str(logdir))
    events.Reload()
    provider = data_provider.MultiplexerDataProvider(events, str(logdir))
    backend = backend_context.Context(base_plugin.TBContext(logdir=str(logdir), multiplexer=events,
                                                            data_provider=provider))
    request = api_pb2.ListSessionGroupsRequest(allowed_statuses=[api_pb2.STATUS_UNKNOWN], slice_size=100)
    groups = list_session_groups.Handler(context.RequestContext(), backend, "", request).run().session_groups
    rows = {}
    for group in groups:
        for session in group.sessions:
            hparams = {key: value.WhichOneof("kind") and getattr(value, value.WhichOneof("kind"))
                       for key, value in group.hparams.items()}
            rows[session.name] = (hparams, {m.name.tag: m.value for m in session.metric_values})
    return rows


def test_a_run_and_its_resume_are_one_row_of_the_hparams_table(tmp_path, data_cache):
    run = tmp_path / "run"
    for steps, lr in ((4, 0.002), (6, 0.001)):  # the resume changes an optimizer setting
        run_fsf("train", str(REPO / "yamls/quickstart.yaml"), f"run_dir={run}", f"data.cache_dir={data_cache}",
                *TINY_DATA, *TINY_MODEL, "model.name=fs", f"train.max_steps={steps}", "train.ckpt_every=4",
                "train.log_every=2", "train.eval_every=2", "train.eval_batches=1", "train.progress=false",
                "train.tensorboard=true", f"optim.lr={lr}")
    rows = hparams_table(tmp_path)  # tensorboard pointed at the runs' folder, as one compares runs
    assert list(rows) == ["run/tensorboard"]
    hparams, metrics = rows["run/tensorboard"]
    assert hparams["model.name"] == "fs" and hparams["model.d_model"] == 32 and hparams["data.seq_len"] == 64
    assert hparams["model.attention.cell_size"] == 16 and hparams["batch.tokens"] == 2 * 64
    assert hparams["parallel.world_size"] == 1 and hparams["model.parameters"] > 0
    # the session the run started with: tensorboard keeps a directory's first
    assert hparams["optim.lr"] == pytest.approx(0.002) and hparams["train.max_steps"] == 4
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert metrics["train/loss"] == pytest.approx(last["loss"]) and metrics["val/best_ppl"] == pytest.approx(
        last["val/best_ppl"])
