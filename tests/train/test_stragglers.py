"""Stragglers named (fsframework.train.stragglers): the per-rank fields of a logged step, and one warning
per streak of a rank busy `factor` times the others' for `intervals` logged steps. The fields of a
two-rank run: tests/parallel/test_train_parallel.py."""

from __future__ import annotations

import pytest

from fsframework.config import ConfigError, load_config
from fsframework.train.stragglers import StragglerWatch, gather_busy_seconds


def test_fields_name_the_busiest_rank():
    fields, warning = StragglerWatch(1.5, 3).observe(1, [0.2, 0.5, 0.3, 0.25])
    assert fields == {"rank_busy_s_min": 0.2, "rank_busy_s_max": 0.5, "rank_slowest": 1} and warning is None


def test_a_rank_slow_for_several_logged_steps_is_named_once():
    watch = StragglerWatch(1.5, 3)
    warnings = [watch.observe(step, [0.2, 0.21, 0.4, 0.2])[1] for step in range(1, 7)]
    assert warnings[:2] == [None, None] and warnings[3:] == [None, None, None]
    assert warnings[2].startswith("rank 2 is a straggler") and "up to step 3" in warnings[2] and "(2.0x)" in warnings[2]


def test_a_streak_ends_when_the_rank_catches_up_or_another_is_slowest():
    watch = StragglerWatch(1.5, 2)
    steps = [[0.2, 0.4], [0.2, 0.2], [0.2, 0.4], [0.4, 0.2], [0.4, 0.2]]
    warnings = [watch.observe(step, busy)[1] for step, busy in enumerate(steps, 1)]
    assert warnings[:4] == [None] * 4 and warnings[4].startswith("rank 0 is a straggler")


def test_factor_zero_logs_the_fields_and_never_warns():
    watch = StragglerWatch(0.0, 1)
    assert all(watch.observe(step, [0.1, 10.0]) == ({"rank_busy_s_min": 0.1, "rank_busy_s_max": 10.0,
                                                     "rank_slowest": 1}, None) for step in range(3))


def test_one_process_gathers_its_own():
    assert gather_busy_seconds(0.25, None, 1) == [0.25]


@pytest.mark.parametrize("override, message", [("train.straggler_factor=1.0", "must be above 1"),
                                               ("train.straggler_intervals=0", "straggler_intervals")])
def test_bad_settings_are_refused(override, message):
    from pathlib import Path

    with pytest.raises(ConfigError, match=message):
        load_config(Path(__file__).resolve().parents[2] / "yamls" / "quickstart.yaml", [override])
