"""Every path an `fsf` command takes: a missing one, one of the wrong kind (a file where a directory
is expected or the reverse), an occupied output and an unreadable input each fail in one line on
stderr that names the path, with exit code 2, before any work and leaving nothing behind (no output
directory, no run directory, no file changed). Data files are read as `fsf data build` reads them."""

import json

import pytest

from tests.export.helpers import random_checkpoint
from tests.utils import REPO, run_fsf

JOB = str(REPO / "yamls" / "quickstart.yaml")

# (command, arguments with {p} for the place below, the path the error must name, words of the problem)
CASES = [
    ("train", ["{p}/missing.yaml"], "{p}/missing.yaml", ["not found"]),
    ("train", ["{p}/a_dir"], "{p}/a_dir", ["is a directory"]),
    ("train", [JOB, "run_dir={p}/a_file"], "{p}/a_file", ["is a file"]),
    ("train", [JOB, "run_dir={p}/a_file/run"], "{p}/a_file", ["is a file"]),
    ("train", [JOB, "run_dir=/proc/fsf-run"], "/proc/fsf-run", ["cannot create a directory in /proc"]),  # not writable
    ("train", [JOB, "run_dir={p}/new", "data.source=shards", "data.path={p}/missing"], "{p}/missing", ["not found"]),
    ("train", [JOB, "run_dir={p}/new", "data.source=shards", "data.path={p}/a_file"], "{p}/a_file", ["is a file"]),
    ("train", [JOB, "run_dir={p}/new", "data.source=shards", "data.path={p}/a_dir"], "{p}/a_dir", ["no MDS index"]),
    ("train", [JOB, "run_dir={p}/new", "data.source=shards", "data.path={p}/junk_mds"], "{p}/junk_mds", ["malformed index"]),
    ("train", [JOB, "run_dir={p}/new", "data.tokenizer={p}/missing.json"], "{p}/missing.json", ["not found"]),
    ("train", [JOB, "run_dir={p}/new", "data.tokenizer={p}/junk.json"], "{p}/junk.json", ["not a readable"]),
    ("train", [JOB, "run_dir={p}/new", "train.init_from={p}/missing"], "{p}/missing", ["not found"]),
    ("train", [JOB, "run_dir={p}/new", "train.init_from={p}/a_dir"], "{p}/a_dir", ["no complete checkpoint"]),
    ("run", [JOB, "run_dir={p}/a_file"], "{p}/a_file", ["is a file"]),
    ("run", [JOB, "run_dir={p}/new", "data.source=shards", "data.path={p}/missing"], "{p}/missing", ["not found"]),
    ("config", ["{p}/a_dir"], "{p}/a_dir", ["is a directory"]),
    ("launch", ["{p}/missing.yaml", "--dry-run"], "{p}/missing.yaml", ["not found"]),
    ("launch", [JOB, "run_dir={p}/new", "--dry-run", "--hostfile", "{p}/a_dir"], "{p}/a_dir", ["is a directory"]),
    ("launch", [JOB, "run_dir={p}/new", "--dry-run", "--hostfile", "{p}/missing"], "{p}/missing", ["not found"]),
    ("eval", ["{p}/missing"], "{p}/missing", ["not found"]),
    ("eval", ["{p}/a_file"], "{p}/a_file", ["is a file"]),
    ("eval", ["{p}/a_dir"], "{p}/a_dir", ["no complete checkpoint"]),
    ("eval", ["{p}/no_checkpoints"], "{p}/no_checkpoints", ["no complete checkpoint"]),
    ("eval", ["{p}/run", "--tasks", "passkey", "--out", "{p}/a_dir"], "{p}/a_dir", ["is a directory"]),
    ("eval", ["{p}/run", "--tasks", "passkey", "--out", "{p}/a_file/s.json"], "{p}/a_file", ["is a file"]),
    ("eval", ["{p}/run", "--harness", "t", "--harness-include", "{p}/missing"], "{p}/missing", ["not found"]),
    ("generate", ["{p}/missing", "--prompt", "x"], "{p}/missing", ["not found"]),
    ("generate", ["{p}/a_file", "--prompt", "x"], "{p}/a_file", ["is a file"]),
    ("generate", ["{p}/no_checkpoints", "--prompt", "x"], "{p}/no_checkpoints", ["no complete checkpoint"]),
    ("generate", ["{p}/run", "--prompt-file", "{p}/missing"], "{p}/missing", ["not found"]),
    ("generate", ["{p}/run", "--prompt-file", "{p}/a_dir"], "{p}/a_dir", ["is a directory"]),
    ("calibrate", ["{p}/missing"], "{p}/missing", ["not found"]),
    ("calibrate", ["{p}/a_file"], "{p}/a_file", ["is a file"]),
    ("calibrate", ["{p}/a_dir"], "{p}/a_dir", ["no complete checkpoint"]),
    ("calibrate", ["{p}/run", "--data", "{p}/missing"], "{p}/missing", ["not found"]),
    ("calibrate", ["{p}/run", "--data", "{p}/a_file"], "{p}/a_file", ["is a file"]),
    ("calibrate", ["{p}/run", "--data", "{p}/a_dir"], "{p}/a_dir", ["no MDS dataset"]),
    ("export", ["{p}/missing", "{p}/out"], "{p}/missing", ["not found"]),
    ("export", ["{p}/a_file", "{p}/out"], "{p}/a_file", ["is a file"]),
    ("export", ["{p}/no_checkpoints", "{p}/out"], "{p}/no_checkpoints", ["no complete checkpoint"]),
    ("export", ["{p}/run", "{p}/occupied"], "{p}/occupied", ["not empty"]),
    ("export", ["{p}/run", "{p}/a_file"], "{p}/a_file", ["is a file"]),
    ("export", ["{p}/run", "{p}/a_file/out"], "{p}/a_file", ["is a file"]),
    ("convert", ["{p}/missing"], "{p}/missing", ["not found"]),
    ("convert", ["{p}/run", "{p}/occupied"], "{p}/occupied", ["not empty"]),
    ("import", ["{p}/missing", "{p}/out"], "{p}/missing", ["not found"]),
    ("import", ["{p}/a_file", "{p}/out"], "{p}/a_file", ["is a file"]),
    ("import", ["{p}/a_dir", "{p}/out"], "{p}/a_dir", ["no config.json"]),
    ("import", ["{p}/a_dir", "{p}/occupied"], "{p}/occupied", ["not empty"]),
    ("data build", ["{p}/missing.txt", "--out", "{p}/out"], "{p}/missing.txt", ["not found"]),
    ("data build", ["{p}/a_dir", "--out", "{p}/out"], "{p}/a_dir", ["is a directory"]),
    ("data build", ["{p}/bad.jsonl", "--out", "{p}/out"], "{p}/bad.jsonl", ["line 2", "expected a string"]),
    ("data build", ["{p}/doc.txt", "--out", "{p}/a_file"], "{p}/a_file", ["is a file"]),
    ("data build", ["{p}/doc.txt", "--out", "{p}/occupied"], "{p}/occupied", ["not empty", "--overwrite"]),
    ("data build", ["{p}/doc.txt", "--out", "{p}/occupied", "--overwrite"], "{p}/occupied", ["not an MDS dataset"]),
    ("data build", ["{p}/doc.txt", "--out", "{p}/a_file/out"], "{p}/a_file", ["is a file"]),
    ("data build", ["{p}/doc.txt", "--out", "{p}/out", "--tokenizer", "{p}/missing.json"], "{p}/missing.json",
     ["not found"]),
    ("data build", ["{p}/doc.txt", "--out", "{p}/out", "--tokenizer", "{p}/junk.json"], "{p}/junk.json",
     ["not a readable"]),
    ("data inspect", ["{p}/missing"], "{p}/missing", ["not found"]),
    ("data inspect", ["{p}/a_file"], "{p}/a_file", ["is a file"]),
    ("data inspect", ["{p}/a_dir"], "{p}/a_dir", ["no index.json"]),
    ("data inspect", ["{p}/junk_mds/train"], "{p}/junk_mds/train/index.json", ["malformed index"]),
    ("data inspect", ["{p}/a_dir", "--tokenizer", "{p}/missing.json"], "{p}/missing.json", ["not found"]),
    ("data tokenizer", ["{p}/a_dir"], "{p}/a_dir", ["is a directory"]),
    ("data tokenizer", ["{p}/a_file"], "{p}/a_file", ["exists"]),
    ("data tokenizer", ["{p}/a_file/tok.json"], "{p}/a_file", ["is a file"]),
    ("data tokenizer", ["{p}/tok.json", "--input", "{p}/missing.txt"], "{p}/missing.txt", ["not found"]),
    ("data tokenizer", ["{p}/tok.json", "--input", "{p}/a_dir"], "{p}/a_dir", ["is a directory"]),
    ("runs", ["{p}/a_dir"], "{p}/a_dir", ["not a run directory"]),
    ("runs", ["{p}/run", "--plot", "{p}/a_dir"], "{p}/a_dir", ["is a directory"]),
]


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """A folder of every kind of path: missing ones are simply not there."""
    p = tmp_path_factory.mktemp("paths")
    (p / "a_dir").mkdir()
    (p / "a_file").write_text("x")
    (p / "occupied").mkdir()
    (p / "occupied" / "notes.txt").write_text("mine")
    (p / "doc.txt").write_text("a document of the user's own " * 20)
    (p / "bad.jsonl").write_text('{"text": "fine"}\n{"text": 3}\n')
    (p / "junk.json").write_text("{not a tokenizer")
    (p / "junk_mds" / "train").mkdir(parents=True)
    (p / "junk_mds" / "train" / "index.json").write_text("{not an index")
    random_checkpoint(p / "run", "fs")
    (p / "no_checkpoints" / "checkpoints").mkdir(parents=True)  # a run that never saved
    (p / "no_checkpoints" / "config.yaml").write_text((p / "run" / "config.yaml").read_text())
    return p


def _tree(root):
    """Every path under `root` with its size and modification time: what a command would change."""
    return {str(path.relative_to(root)): (path.is_dir(), path.stat().st_size, path.stat().st_mtime_ns)
            for path in root.rglob("*")}


@pytest.mark.parametrize("command, args, named, words", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_a_bad_path_fails_in_one_line_and_leaves_nothing(place, command, args, named, words, monkeypatch):
    monkeypatch.chdir(place)  # whatever a command would write relative to its directory lands in the tree
    before = _tree(place)
    proc = run_fsf(*command.split(), *(a.format(p=place) for a in args), check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert named.format(p=place) in lines[0] and all(w in lines[0] for w in words), lines[0]
    assert _tree(place) == before


def test_the_table_covers_every_command_that_takes_a_path():
    from fsframework.cli import app

    commands = {c.name for c in app.registered_commands} | {
        f"{g.name} {c.name or c.callback.__name__}" for g in app.registered_groups
        for c in g.typer_instance.registered_commands}
    assert commands - {"info"} - {c[0] for c in CASES} == set()  # info takes no path


def test_tokenizer_reads_inputs_as_data_build_does(tmp_path):
    good = tmp_path / "docs.jsonl"
    good.write_text("".join(json.dumps({"text": f"zebra crossing number {i}", "id": i}) + "\n" for i in range(50)))
    run_fsf("data", "tokenizer", str(tmp_path / "tok.json"), "--input", str(good), "--vocab-size", "300")
    vocab = json.loads((tmp_path / "tok.json").read_text())["model"]["vocab"]
    merged = [piece for piece in vocab if len(piece) > 1]
    assert any("zebra" in piece or "ebra" in piece for piece in merged)
    assert not any("text" in piece or '"' in piece for piece in merged)  # documents, not the JSON around them
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": 3}\n')
    proc = run_fsf("data", "tokenizer", str(tmp_path / "tok2.json"), "--input", str(bad), check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "bad.jsonl, line 2" in proc.stderr and "expected a string" in proc.stderr
    assert not (tmp_path / "tok2.json").exists()
