"""The partial builds killed builds leave (fsframework.data.partial_builds): removed by the next build
of the same output on the host, a live or another host's left alone; a killed `fsf data build`
followed by a rebuild gives the shards of an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

from fsframework.data.build import build_shards
from fsframework.data.partial_builds import clean_partial_builds, partial_build_dir


def _exited_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_only_dead_builds_of_this_host_and_output_are_removed(tmp_path):
    out = tmp_path / "shards"
    dead, host = _exited_pid(), socket.gethostname()
    folders = {
        "dead": tmp_path / f".shards.building-{dead}@{host}",
        "dead, token, no host (older name)": tmp_path / f".shards.building-{dead}-0a1b",
        "alive (this process)": partial_build_dir(out),
        "another host": tmp_path / f".shards.building-{dead}@not-{host}",
        "another output": tmp_path / f".other.building-{dead}@{host}",
    }
    for folder in folders.values():
        folder.mkdir()
        (folder / "part.mds").write_bytes(b"x")
    removed = clean_partial_builds(out)
    assert sorted(removed) == sorted([folders["dead"], folders["dead, token, no host (older name)"]])
    assert [name for name, folder in folders.items() if folder.exists()] == [
        "alive (this process)", "another host", "another output"]


def _files(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "build.json"}


def test_a_killed_build_is_cleaned_and_the_rebuild_equals_an_uninterrupted_one(tmp_path):
    rows = [json.dumps({"text": f"document {i}: " + "lorem ipsum dolor " * (i % 23)}) for i in range(12000)]
    source = tmp_path / "docs.jsonl"
    source.write_text("\n".join(rows) + "\n")
    # small shards: the first is written early, long before the build ends
    build = [sys.executable, "-m", "fsframework", "data", "build", str(source), "--seq-len", "64",
             "--workers", "1", "--shard-bytes", "32768", "--out"]
    out = tmp_path / "out"
    child = subprocess.Popen(build + [str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    partial = partial_build_dir(out).with_name(f".out.building-{child.pid}@{socket.gethostname()}")
    deadline = time.monotonic() + 60
    while not any(partial.rglob("*.mds*")) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # until the build has written a shard
    assert child.poll() is None, "the build finished before it could be killed: give it more input"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert partial.is_dir() and not out.exists()  # what a killed build leaves
    rebuilt = subprocess.run(build + [str(out)], capture_output=True, text=True, check=True)
    assert f"removed {partial}" in rebuilt.stdout and not partial.exists()
    whole = tmp_path / "whole"
    build_shards([str(source)], whole, seq_len=64, workers=1, size_limit=32768, verbose=False)
    assert _files(out) == _files(whole) and _files(out)
