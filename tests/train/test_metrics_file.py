"""metrics.jsonl on resume (fsframework.train.monitor.truncate_metrics): the records after the
checkpoint dropped, a last line torn by a full disk or a kill dropped too, a torn line elsewhere refused."""

from __future__ import annotations

import json

import pytest

from fsframework.train.monitor import truncate_metrics


def _write(path, steps, tail=""):
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in steps) + tail)


def test_records_after_the_checkpoint_and_a_torn_last_line_are_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write(path, range(1, 8), tail='{"step": 8, "lo')
    truncate_metrics(path, 5)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3, 4, 5]
    assert not list(tmp_path.glob("*.tmp"))  # replaced whole, no temporary left


def test_a_torn_line_before_the_last_is_refused(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"st\n{"step": 2}\n')
    with pytest.raises(json.JSONDecodeError):
        truncate_metrics(path, 5)


def test_a_full_disk_under_a_log_write_is_one_line_and_exit_1(capsys):
    import errno

    import typer

    from fsframework.cli.train import guarded

    def write():
        raise OSError(errno.ENOSPC, "No space left on device", "run/metrics.jsonl")

    with pytest.raises(typer.Exit) as stopped:
        guarded(write)
    assert stopped.value.exit_code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run/metrics.jsonl: No space left on device" in err and "rerun resumes" in err

    def other():
        raise OSError(errno.EACCES, "Permission denied", "run")

    with pytest.raises(PermissionError):  # not a full disk: the error as it is
        guarded(other)
