"""Files the commands write are readable by whoever may read the run: every file of a run directory
(config, metrics, checkpoints, evaluation, calibration) and of an export carries the permission
bits the process's umask gives a new file, like the config.yaml beside them. Atomic writes go
through temporary files; one made with a private mode (as `tempfile.mkstemp` does, 0600) and
renamed into place would hide a checkpoint from the rest of a team's group."""

from __future__ import annotations

import os
import stat

import pytest

from tests.utils import REPO, TINY_DATA, TINY_MODEL, run_fsf


@pytest.fixture
def group_umask():
    old = os.umask(0o027)  # group may read, others may not: a shared project directory
    yield 0o640
    os.umask(old)


def modes(root) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*") if p.is_file()}


def test_run_and_export_files_are_readable_by_the_group(tmp_path, data_cache, group_umask):
    run = tmp_path / "run"
    run_fsf("train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={run}", f"data.cache_dir={data_cache}",
            *TINY_DATA, *TINY_MODEL, "model.name=fs", "model.attention.block_size=16", "train.max_steps=2",
            "train.ckpt_every=2", "train.progress=false")
    run_fsf("eval", str(run), "--tasks", "perplexity", "--lengths", "64", "--num-samples", "1")
    run_fsf("calibrate", str(run), "--windows", "2", "--seq-len", "64")
    run_fsf("export", str(run), str(tmp_path / "export"))
    for root in (run, tmp_path / "export"):
        found = modes(root)
        assert len(found) > 3, found
        private = {name: oct(mode) for name, mode in found.items() if mode & 0o040 == 0}
        assert not private, f"files the group cannot read under {root}: {private}"
