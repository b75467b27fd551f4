"""Every logged step carries its throughput: tokens/s, the kind's FLOPs per token, TFLOP/s per
device (MFU where the peak is known), peak memory and the step's time by phase, in metrics.jsonl,
tensorboard and the plain log; `train.profile` writes a trace torch.profiler's tooling reads."""

from __future__ import annotations

import json
import time

import pytest
import torch

from fsframework.config import load_config
from fsframework.config.checks import ConfigError
from fsframework.models.flops import training_flops_per_token
from fsframework.parallel.collective_time import CollectiveClock
from fsframework.train.monitor import summary_throughput, throughput_text
from fsframework.train.throughput import device_peak_tflops, step_record
from tests.utils import REPO, TINY_DATA, TINY_MODEL, run_fsf

FIGURES = ("tokens_per_s", "flops_per_token", "tflops", "host_rss_mb", "data_share", "compute_share",
           "optimizer_share", "step_s")


def test_a_step_record_divides_the_work_by_time_and_devices():
    record = step_record(elapsed=2.0, phases={"data": 0.5, "compute": 1.2, "optimizer": 0.3}, tokens=4096,
                         flops_per_token=1e9, world_size=4, peak_tflops=None, memory={"host_rss_mb": 10.0})
    assert record["tokens_per_s"] == 2048 and record["tflops"] == pytest.approx(4096 * 1e9 / 2.0 / 4 / 1e12)
    assert record["data_share"] == 0.25 and "mfu" not in record and record["host_rss_mb"] == 10.0
    # collectives are inside forward and backward: their shares are logged beside the phases
    timed = step_record(elapsed=2.0, phases={"data": 0.5, "compute": 1.2, "optimizer": 0.3}, tokens=4096,
                        flops_per_token=1e9, world_size=4, peak_tflops=None, memory={},
                        collectives={"collectives": 0.4, "grad_reduce": 0.1})
    assert (timed["collectives_share"], timed["grad_reduce_share"], timed["compute_share"]) == (0.2, 0.05, 0.6)
    assert "collectives_share" not in record
    with_peak = step_record(elapsed=2.0, phases={}, tokens=4096, flops_per_token=1e9, world_size=4,
                            peak_tflops=0.001, memory={})
    assert with_peak["mfu"] == pytest.approx(with_peak["tflops"] / 0.001)


def test_a_collective_clock_times_only_between_start_and_take():
    clock, cpu = CollectiveClock(), torch.device("cpu")
    with clock.timing(cpu):  # not started: a validation's or a test's collectives
        time.sleep(0.01)
    clock.start()
    with clock.timing(cpu):
        time.sleep(0.02)
    time.sleep(0.02)  # outside a collective
    lap = clock.take()
    with clock.timing(cpu):
        time.sleep(0.01)
    assert 0.02 <= lap.seconds() < 0.035 and clock.take().seconds() == 0.0


def test_the_peak_comes_from_the_setting_or_the_table(monkeypatch):
    cpu = torch.device("cpu")
    assert device_peak_tflops(cpu, "fp32") is None and device_peak_tflops(cpu, "fp32", 7.5) == 7.5
    cuda = torch.device("cuda", 0)
    for name, dtype, peak in (("NVIDIA H100 80GB HBM3", "bf16", 989.4), ("NVIDIA H100 PCIe", "bf16", 756.0),
                              ("NVIDIA A100-SXM4-80GB", "fp32", 19.5), ("NVIDIA H200", "bf16", 989.4),
                              ("Some Other GPU", "bf16", None), ("Tesla V100-SXM2-32GB", "bf16", None)):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device, name=name: name)
        assert device_peak_tflops(cuda, dtype) == peak, name


def test_a_negative_peak_or_profile_setting_is_refused(tmp_path):
    for override, key in (("train.peak_tflops=-1", "train.peak_tflops"), ("train.profile.steps=-2", "train.profile.steps"),
                          ("train.profile.start=0", "train.profile.start")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(REPO / "yamls" / "quickstart.yaml", [override])


def test_the_plain_line_and_the_summary_show_the_figures():
    record = {"tokens_per_s": 100.0, "tflops": 0.0123, "host_rss_mb": 2048.0, "data_share": 0.07, "mfu": 0.25}
    assert throughput_text(record) == "  TFLOP/s 0.0123 (MFU 25.0%)  rss 2,048 MB  data 7%"
    assert throughput_text({"tokens_per_s": 1.0}) == ""
    assert throughput_text({**record, "collectives_share": 0.21, "grad_reduce_share": 0.04}).endswith(
        "data 7%  collectives 21%  grad reduce 4%")
    text = summary_throughput([{**record, "tokens_per_s": v, "tflops": v / 1e4} for v in (100.0, 300.0, 200.0)])
    assert text == "median 200 tokens/s, 0.02 TFLOP/s per device (MFU 25.0%), peak host memory 2,048 MB"


@pytest.mark.parametrize("kind", ["tfpp", "fs"])
def test_a_run_logs_its_throughput_at_every_logging_step(kind, tmp_path, data_cache):
    run = tmp_path / "run"
    done = run_fsf("train", str(REPO / "yamls/quickstart.yaml"), f"run_dir={run}", f"data.cache_dir={data_cache}",
                   *TINY_DATA, *TINY_MODEL, f"model.name={kind}", "train.max_steps=4", "train.ckpt_every=4",
                   "train.log_every=2", "train.progress=false", "train.tensorboard=true",
                   "train.profile.steps=2", "train.profile.start=2")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4]
    cfg = load_config(run / "config.yaml")
    for record in records:
        assert all(key in record for key in FIGURES), sorted(set(FIGURES) - set(record))
        assert record["flops_per_token"] == training_flops_per_token(cfg.model, 64, 1)
        assert record["tflops"] > 0 and 0 <= record["data_share"] <= 1 and "mfu" not in record  # a CPU: no peak
        # one process: no collective to time, so no share (not a 0 that reads as measured)
        assert "collectives_share" not in record and "grad_reduce_share" not in record
    assert done.stdout.count("TFLOP/s") >= 3  # two plain lines and the summary
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard")).Reload()
    assert {"train/tflops", "train/flops_per_token", "train/data_share", "train/host_rss_mb"} <= set(
        events.Tags()["scalars"])
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator as Plugins

    text = Plugins(str(run / "tensorboard")).Reload()
    config = [t for t in text.Tags()["tensors"] if t.startswith("config")]
    written = text.Tensors(config[0])[0].tensor_proto.string_val[0].decode()
    assert f"    name: {kind}" in written and "    max_steps: 4" in written  # the resolved config, in the text tab
    traces = sorted((run / "profile").glob("rank0.*.pt.trace.json"))
    assert len(traces) == 1 and f"profile written: {traces[0]}" in done.stdout.replace("\n", "")
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert any(e.get("name", "").startswith("aten::") for e in events)  # the steps' ops are in it


def test_profiling_is_off_by_default(tmp_path, data_cache):
    run = tmp_path / "run"
    run_fsf("train", str(REPO / "yamls/quickstart.yaml"), f"run_dir={run}", f"data.cache_dir={data_cache}",
            *TINY_DATA, *TINY_MODEL, "model.name=tfpp", "train.max_steps=2", "train.ckpt_every=2",
            "train.progress=false", "train.tensorboard=false")
    assert not (run / "profile").exists()


def _fake_run(root, name, kind, rates, val=None):
    """A run directory as training leaves it: config.yaml and metrics.jsonl (what `fsf runs` reads)."""
    from fsframework.config import to_yaml

    run = root / name
    run.mkdir()
    cfg = load_config(REPO / "yamls" / "quickstart.yaml", [f"model.name={kind}", f"run_dir={run}"])
    (run / "config.yaml").write_text(to_yaml(cfg))
    lines = [{"step": i + 1, "loss": 5.0 - i, "tokens_per_s": r, "tflops": r / 1e6, "host_rss_mb": 100.0 + i}
             for i, r in enumerate(rates)]
    if val is not None:
        lines[-1]["val/loss"] = val
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run


def test_fsf_runs_prints_runs_side_by_side_and_plots_them(tmp_path):
    a = _fake_run(tmp_path, "a", "fs", [100.0, 300.0, 200.0], val=2.5)
    b = _fake_run(tmp_path, "b", "tfpp", [50.0, 70.0])
    plot = tmp_path / "runs.png"
    done = run_fsf("runs", str(a), str(b), "--plot", str(plot))
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip().startswith(str(tmp_path))}
    assert set(rows) == {str(a), str(b)}
    assert rows[str(a)].split()[1:] == ["fs", "128x4x4", "@", "512", "3", "3.0000", "2.5000", "2.5000", "200",
                                        "0.0002", "-", "102"]
    assert rows[str(b)].split()[1:6] == ["tfpp", "128x4x4", "@", "512", "2"] and " 70 " in rows[str(b)]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {plot}" in done.stdout


def test_fsf_runs_names_a_directory_that_is_no_run(tmp_path):
    done = run_fsf("runs", str(tmp_path), check=False)
    assert done.returncode == 2 and "not a run directory" in done.stdout + done.stderr
