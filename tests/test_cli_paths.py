"""Commands that take a path or an output folder: a missing, occupied or wrong-kind path fails in
one line with exit code 2 before any work and leaves nothing behind; data files are read as
`fsf data build` reads them."""

import json

import pytest

from tests.export.helpers import random_checkpoint
from tests.utils import run_fsf


def _one_line_error(proc, *words):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), proc.stderr


@pytest.fixture()
def place(tmp_path):
    (tmp_path / "a_dir").mkdir()
    (tmp_path / "a_file").write_text("x")
    return tmp_path


def test_eval_out_that_is_a_directory(place):
    run = random_checkpoint(place / "run", "fs")
    _one_line_error(run_fsf("eval", str(run), "--tasks", "passkey", "--out", str(place / "a_dir"), check=False),
                    "is a directory")
    assert not any((place / "a_dir").iterdir()) and sorted(p.name for p in place.iterdir()) == ["a_dir", "a_file", "run"]


@pytest.mark.parametrize("data, words", [("missing", ["not found"]), ("a_file", ["not a directory"]),
                                         ("a_dir", ["no MDS dataset"])])
def test_calibrate_data_that_is_not_a_dataset(place, data, words):
    run = random_checkpoint(place / "run", "fs")
    _one_line_error(run_fsf("calibrate", str(run), "--data", str(place / data), check=False), *words)
    assert not any(run.rglob("calibration.json"))


def test_tokenizer_out_that_is_a_directory(place):
    _one_line_error(run_fsf("data", "tokenizer", str(place / "a_dir"), check=False), "is a directory")
    assert sorted(p.name for p in place.iterdir()) == ["a_dir", "a_file"]


def test_tokenizer_reads_inputs_as_data_build_does(place):
    good = place / "docs.jsonl"
    good.write_text("".join(json.dumps({"text": f"zebra crossing number {i}", "id": i}) + "\n" for i in range(50)))
    run_fsf("data", "tokenizer", str(place / "tok.json"), "--input", str(good), "--vocab-size", "300")
    vocab = json.loads((place / "tok.json").read_text())["model"]["vocab"]
    merged = [piece for piece in vocab if len(piece) > 1]
    assert any("zebra" in piece or "ebra" in piece for piece in merged)
    assert not any("text" in piece or '"' in piece for piece in merged)  # documents, not the JSON around them
    bad = place / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": 3}\n')
    _one_line_error(run_fsf("data", "tokenizer", str(place / "tok2.json"), "--input", str(bad), check=False),
                    "bad.jsonl, line 2", "expected a string")
    assert not (place / "tok2.json").exists()
