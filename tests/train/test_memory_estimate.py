"""The memory guard (fsframework.train.memory_estimate): a step that cannot fit is refused in one
line before any work, naming what fits; the default quickstart passes; the override lets it
through; the estimate grows with the row's length as its formula says. The host's memory is
mocked, so nothing here depends on the machine's RAM."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsframework.config import ConfigError, load_config
from fsframework.train import memory_estimate, trainer
from fsframework.train.memory_estimate import GB, USABLE_FRACTION, check_memory, estimate

QUICKSTART = Path(__file__).resolve().parents[2] / "yamls" / "quickstart.yaml"
HOST = 23 * GB  # the host of the report: 23 GB


@pytest.fixture
def host(monkeypatch):
    monkeypatch.setattr(memory_estimate, "host_available_bytes", lambda: HOST)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(trainer.torch.cuda, "is_available", lambda: False)


def quickstart(tmp_path, *overrides: str):
    return load_config(QUICKSTART, [f"run_dir={tmp_path / 'run'}", *overrides])


def test_long_rows_refused_before_any_work(host, tmp_path, monkeypatch):
    """data.seq_len=100000 on the quickstart model: one line naming the estimate, the memory,
    the longest length that fits and the override, before the data, the run dir or the engine."""
    def no_work(*args, **kwargs):
        raise AssertionError("work started before the memory check")

    monkeypatch.setattr(trainer, "check_data_fits", no_work)
    monkeypatch.setattr(trainer, "Trainer", no_work)
    cfg = quickstart(tmp_path, "data.seq_len=100000", "train.max_steps=1")
    with pytest.raises(ConfigError) as info:
        trainer.train(cfg)
    message = str(info.value)
    assert "\n" not in message
    assert "data.seq_len=100000" in message and "23.0 GB available host memory" in message
    assert "train.memory_check=false" in message
    fitting = int(message.split("the largest that fits is data.seq_len=")[1].split()[0])
    assert 0 < fitting < 100000 and fitting % cfg.model.attention.block_size == 0
    limit = USABLE_FRACTION * HOST
    at = lambda n: estimate(quickstart(tmp_path, f"data.seq_len={n}")).total  # noqa: E731
    assert at(fitting) <= limit < at(fitting + cfg.model.attention.block_size)
    assert not (tmp_path / "run").exists()


def test_default_quickstart_passes_and_says_its_estimate(host, tmp_path):
    lines = []
    found = check_memory(quickstart(tmp_path), cuda=False, log=lines.append)
    assert found.total < USABLE_FRACTION * HOST
    assert len(lines) == 1 and lines[0].startswith("memory: about ") and "of 23.0 GB available host memory" in lines[0]


def test_override_lets_it_through(host, tmp_path):
    cfg = quickstart(tmp_path, "data.seq_len=100000", "train.memory_check=false")
    lines = []
    assert check_memory(cfg, cuda=False, log=lines.append).total > HOST  # said, not refused
    assert len(lines) == 1
    # a limit of one's own replaces the device's memory, both ways
    with pytest.raises(ConfigError, match="train.memory_limit_gb"):
        check_memory(quickstart(tmp_path, "train.memory_limit_gb=0.01"), cuda=False, log=lines.append)
    check_memory(quickstart(tmp_path, "data.seq_len=100000", "train.memory_limit_gb=1000"), cuda=False,
                 log=lines.append)


@pytest.mark.parametrize("name", ["tfpp", "fs", "fsl", "swa", "argrc"])
def test_activations_grow_linearly_with_length(tmp_path, name):
    """Every kind but ALiBi keeps O(T) per row: doubling T doubles the activations; checkpointing
    keeps less."""
    def acts(n, *more):
        return estimate(quickstart(tmp_path, f"model.name={name}", f"data.seq_len={n}", *more),
                        parameters=0).activations

    assert acts(4096) == pytest.approx(2 * acts(2048))
    assert acts(4096, "train.activation_checkpointing=true") < acts(4096) / 3


def test_alibi_bias_quadratic_and_loss_chunk_bounds_logits(tmp_path):
    def acts(n, *more):
        return estimate(quickstart(tmp_path, f"data.seq_len={n}", *more), parameters=0).activations

    quad = [acts(n, "model.name=alibi") - acts(n, "model.name=tfpp") for n in (2048, 4096)]
    assert quad[1] == pytest.approx(4 * quad[0])
    # the logits [B, T, V] in fp32, three of them, unless train.loss_chunk bounds them
    whole, chunked = (estimate(quickstart(tmp_path, "data.seq_len=4096", *more), parameters=0)
                      for more in ((), ("train.loss_chunk=1024",)))
    cfg = quickstart(tmp_path)
    assert whole.activations - chunked.activations == pytest.approx(
        8 * 4096 * (3 * cfg.model.vocab_size * 4 - cfg.model.d_model * 4))


def test_zero_shards_optimizer_gradients_weights(tmp_path):
    parts = [estimate(quickstart(tmp_path, f"parallel.zero_stage={s}"), world_size=4, parameters=10**6)
             for s in range(4)]
    assert parts[0].optimizer == 4 * parts[1].optimizer and parts[1].gradients == 4 * parts[2].gradients
    assert parts[2].weights == 4 * parts[3].weights and parts[0].weights == 4 * 10**6
