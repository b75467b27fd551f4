"""`tools/write_qa_fixture.py DIR`: the user-facing script that writes small QA files in the official
formats for a first `fsf eval --tasks ruler --ruler-data DIR`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from fsframework.eval.ruler_qa import load_qa

REPO = Path(__file__).resolve().parents[1]
FILES = {"qa_1": "dev-v2.0.json", "qa_2": "hotpot_dev_distractor_v1.json"}


def _tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "tools" / "write_qa_fixture.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_the_tool_writes_both_files_and_says_what_they_hold(tmp_path):
    out = tmp_path / "ruler_data"  # created by the tool
    proc = _tool(str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert len(lines) == 2, proc.stdout
    for line, (task, name) in zip(lines, FILES.items()):
        found = re.fullmatch(rf"{task}: (.+) \((\d+) questions, (\d+) documents\)", line)
        assert found, line
        assert Path(found.group(1)) == out / name and (out / name).is_file()
        data = load_qa(task, out)  # the files load as the official ones do
        assert int(found.group(2)) == len(data.questions) > 0
        assert int(found.group(3)) == len(data.documents) > 0
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES.values())


def test_the_seed_changes_the_files(tmp_path):
    assert _tool(str(tmp_path / "a")).returncode == 0
    assert _tool(str(tmp_path / "b"), "--seed", "0").returncode == 0
    assert _tool(str(tmp_path / "c"), "--seed", "1").returncode == 0
    for name in FILES.values():
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()  # 0 is the default
        assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "c" / name).read_bytes()


def test_the_tool_needs_a_folder():
    proc = _tool()
    assert proc.returncode == 2 and "out_dir" in proc.stderr


def test_the_tool_does_not_write_over_files_already_there(tmp_path):
    (tmp_path / FILES["qa_1"]).write_text("the official file")
    proc = _tool(str(tmp_path))
    assert proc.returncode != 0 and proc.stderr.strip().count("\n") == 0 and "already exists" in proc.stderr
    assert (tmp_path / FILES["qa_1"]).read_text() == "the official file"
    assert _tool(str(tmp_path), "--force").returncode == 0
    assert load_qa("qa_1", tmp_path).questions


def test_a_file_for_the_folder_is_one_line(tmp_path):
    target = tmp_path / "f"
    target.write_text("")
    proc = _tool(str(target))
    assert proc.returncode != 0 and proc.stderr.strip() == f"error: {target} is a file, not a folder"
