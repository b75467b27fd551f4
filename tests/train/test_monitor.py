"""metrics.jsonl is standard JSON line by line, a NaN loss included; tensorboard gets the finite
values only; a resumed run drops the records written after its checkpoint."""

from __future__ import annotations

import json
import math

from fsframework.train.monitor import Monitor, strict_json


def _strict(constant):
    raise AssertionError(f"not standard JSON: {constant}")


def test_a_non_finite_value_is_written_as_null():
    line = strict_json({"step": 3, "loss": math.nan, "grad_norm": math.inf, "tokens": 10, "lr": 1e-3})
    assert json.loads(line, parse_constant=_strict) == {"step": 3, "loss": None, "grad_norm": None, "tokens": 10,
                                                         "lr": 1e-3}


def test_the_monitor_logs_nan_steps_and_resumes(tmp_path):
    scalars = []

    class Writer:
        def add_scalar(self, key, value, step):
            scalars.append((key, step))

    monitor = Monitor(tmp_path, total_steps=3, start_step=0, enabled=True, progress=False, tensorboard=False)
    monitor.writer = Writer()
    for step, loss in ((1, 2.0), (2, math.nan), (3, 1.5)):
        monitor.log({"step": step, "loss": loss, "tokens_per_s": 100.0})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line, parse_constant=_strict)["loss"] for line in lines] == [2.0, None, 1.5]
    assert ("train/loss", 2) not in scalars and ("train/loss", 3) in scalars and ("train/tokens_per_s", 2) in scalars
    Monitor(tmp_path, total_steps=3, start_step=2, enabled=True, progress=False, tensorboard=False)
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_a_disabled_monitor_writes_nothing(tmp_path):  # ranks other than 0
    Monitor(tmp_path, total_steps=1, start_step=0, enabled=False, progress=False,
            tensorboard=False).log({"step": 1, "loss": 1.0, "tokens_per_s": 1.0})
    assert not (tmp_path / "metrics.jsonl").exists()
