"""Building MDS shards from text files, reading them back, bad input, inspect, CLI.

The packing tests build without a held-out split (`eval_fraction=0.0`), so the output directory is the
dataset itself and its samples are every document in input order (the split: tests/data/test_heldout.py)."""

import gzip
import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from fsframework.cli.data import data_app
from fsframework.data.build import DataBuildError, build_shards, tokenize_files
from fsframework.data.inspect_shards import ShardError, inspect

EOS = 256
DOCS = ["The first document.\nIt has two lines.", "Zweites Dokument: Grüße, ünïcödé ✓.",
        "third " * 40, "a short one", "The last document of the set, a little longer than the rest of them."]


def read_back(out_dir):
    """All samples via StreamingDataset, in order."""
    from streaming import StreamingDataset

    ds = StreamingDataset(local=str(out_dir), shuffle=False, batch_size=1)
    return [ds[i] for i in range(ds.num_samples)]


def expected_stream(docs):
    tokens, doc_index = [], []
    for k, doc in enumerate(docs):
        ids = list(doc.encode("utf-8")) + [EOS]
        tokens += ids
        doc_index += [k] * len(ids)
    return np.array(tokens), np.array(doc_index)


def check_samples(samples, docs, seq_len):
    tokens, doc_index = expected_stream(docs)
    width = seq_len + 1
    assert len(samples) == len(tokens) // width
    for i, s in enumerate(samples):
        window = slice(i * width, (i + 1) * width)
        assert s["tokens"].dtype == np.int32 and s["tokens"].shape == (width,)
        np.testing.assert_array_equal(s["tokens"], tokens[window])
        np.testing.assert_array_equal(s["doc_ids"], doc_index[window] - doc_index[window][0])
    # and the text decodes back, documents separated by EOS
    flat = np.concatenate([s["tokens"] for s in samples])
    text = bytes(flat[flat != EOS].astype(np.uint8)).decode("utf-8", errors="ignore")
    assert "".join(docs).startswith(text[:-4])


def write_jsonl(path, rows, field="text"):
    lines = [json.dumps({field: r, "id": i}) for i, r in enumerate(rows)]
    data = ("\n".join(lines) + "\n").encode()
    if str(path).endswith(".gz"):
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def test_build_txt(tmp_path):
    files = []
    for i, doc in enumerate(DOCS):
        files.append(tmp_path / f"doc{i}.txt")
        files[-1].write_text(doc, encoding="utf-8")
    stats = build_shards([str(f) for f in files], tmp_path / "out", seq_len=16, eval_fraction=0.0, verbose=False)
    assert stats["documents"] == len(DOCS) and stats["skipped"] == {"empty": 0, "invalid_utf8": 0}
    assert stats["tokens"] == len(expected_stream(DOCS)[0])
    samples = read_back(tmp_path / "out")
    assert stats["samples"] == len(samples)
    check_samples(samples, DOCS, 16)
    assert json.loads((tmp_path / "out" / "build.json").read_text())["stats"]["samples"] == len(samples)


@pytest.mark.parametrize("name", ["docs.jsonl", "docs.jsonl.gz"])
def test_build_jsonl(tmp_path, name):
    path = write_jsonl(tmp_path / name, DOCS, field="content")
    stats = build_shards([str(path)], tmp_path / "out", seq_len=8, text_field="content",
                         size_limit=1 << 10, eval_fraction=0.0, verbose=False)
    assert stats["documents"] == len(DOCS) and stats["shards"] > 1
    check_samples(read_back(tmp_path / "out"), DOCS, 8)


def test_build_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"text": DOCS[:3] + [None] + DOCS[3:], "n": list(range(len(DOCS) + 1))})
    pq.write_table(table, tmp_path / "docs.parquet", row_group_size=2)
    stats = build_shards([str(tmp_path / "docs.parquet")], tmp_path / "out", seq_len=12, eval_fraction=0.0,
                         verbose=False)
    assert stats["documents"] == len(DOCS) and stats["skipped"]["empty"] == 1
    check_samples(read_back(tmp_path / "out"), DOCS, 12)


def test_mixed_inputs_keep_order_and_count_skips(tmp_path):
    (tmp_path / "a.txt").write_text(DOCS[0])
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9 latin-1")
    lines = [json.dumps({"text": DOCS[1]}), "", json.dumps({"text": ""}), json.dumps({"text": None}),
             '{"text": "lone \\ud800 surrogate"}', json.dumps({"text": DOCS[2]})]
    raw = ("\n".join(lines) + "\n").encode() + b'{"text": "bad \xff byte"}\n'
    (tmp_path / "b.jsonl").write_bytes(raw)
    inputs = [str(tmp_path / n) for n in ("a.txt", "empty.txt", "bad.txt", "b.jsonl")]
    stats = build_shards(inputs, tmp_path / "out", seq_len=8, eval_fraction=0.0, verbose=False)
    assert stats["documents"] == 3
    assert stats["skipped"] == {"empty": 4, "invalid_utf8": 3}
    check_samples(read_back(tmp_path / "out"), DOCS[:3], 8)


@pytest.mark.parametrize("workers", [1, 2])
def test_tokenize_files_yields_every_document_in_order_without_writing(tmp_path, workers):
    (tmp_path / "a.txt").write_text(DOCS[0])
    lines = [json.dumps({"text": DOCS[1]}), "", '{"text": 5}', json.dumps({"text": DOCS[2]})]
    (tmp_path / "b.jsonl").write_text("\n".join(lines) + "\n")
    chunks = list(tokenize_files([tmp_path / "a.txt", str(tmp_path / "b.jsonl")], workers=workers))
    records = [record for _, result in chunks for record in result]
    assert [(fi, line, status) for fi, line, status, _ in records] == [
        (0, 1, "ok"), (1, 1, "ok"), (1, 2, "skip"), (1, 3, "error"), (1, 4, "ok")]
    ok = [value for _, _, status, value in records if status == "ok"]
    assert all(v.dtype == np.int32 for v in ok)  # token ids without the EOS that packing appends
    assert [bytes(v.astype(np.uint8)).decode() for v in ok] == DOCS[:3]
    assert records[2][3] == "empty" and "field 'text' is int" in records[3][3]
    # progress: the chunks cover every input byte
    assert sum(size for size, _ in chunks) == (tmp_path / "a.txt").stat().st_size + (tmp_path / "b.jsonl").stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.jsonl"]


@pytest.mark.parametrize("content, message", [
    ('{"text": "ok"}\n{"text": "broken"\n', "bad.jsonl, line 2: malformed JSON"),
    ('{"text": "ok"}\n{"body": "x"}\n', "bad.jsonl, line 2: no field 'text'"),
    ('{"text": 5}\n', "bad.jsonl, line 1: field 'text' is int"),
    ('["text"]\n', "bad.jsonl, line 1: expected a JSON object"),
])
def test_bad_jsonl_is_an_error(tmp_path, content, message):
    (tmp_path / "good.txt").write_text("fine " * 20)
    (tmp_path / "bad.jsonl").write_text(content)
    with pytest.raises(DataBuildError, match=message.replace("[", r"\[")):
        build_shards([str(tmp_path / "good.txt"), str(tmp_path / "bad.jsonl")], tmp_path / "out", seq_len=4,
                     verbose=False)
    # nothing left behind: no output, no temporary directory
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "good.txt"]


def test_bad_files_are_errors(tmp_path):
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(DataBuildError, match=r"x\.csv: unknown input extension"):
        build_shards([str(tmp_path / "x.csv")], tmp_path / "out", seq_len=4, verbose=False)
    with pytest.raises(DataBuildError, match=r"missing\.txt: input file not found"):
        build_shards([str(tmp_path / "missing.txt")], tmp_path / "out", seq_len=4, verbose=False)
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(b'{"text": "abc"}\n' * 50)[:-12])
    with pytest.raises(DataBuildError, match=r"c\.jsonl\.gz: cannot read"):
        build_shards([str(tmp_path / "c.jsonl.gz")], tmp_path / "out", seq_len=4, verbose=False)
    (tmp_path / "t.txt").write_text("tiny")
    with pytest.raises(DataBuildError, match="fewer than one sample"):
        build_shards([str(tmp_path / "t.txt")], tmp_path / "out", seq_len=64, verbose=False)
    assert not (tmp_path / "out").exists()


def test_parquet_missing_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "p.parquet")
    with pytest.raises(DataBuildError, match=r"p\.parquet: no column 'text'"):
        build_shards([str(tmp_path / "p.parquet")], tmp_path / "out", seq_len=4, verbose=False)


def test_existing_output(tmp_path):
    (tmp_path / "a.txt").write_text(DOCS[2])
    build_shards([str(tmp_path / "a.txt")], tmp_path / "out", seq_len=8, eval_fraction=0.0, verbose=False)
    with pytest.raises(DataBuildError, match="not empty"):
        build_shards([str(tmp_path / "a.txt")], tmp_path / "out", seq_len=8, verbose=False)
    stats = build_shards([str(tmp_path / "a.txt")], tmp_path / "out", seq_len=16, overwrite=True, eval_fraction=0.0,
                         verbose=False)
    assert inspect(tmp_path / "out", verbose=False)["seq_len"] == 16 and stats["samples"] > 0
    # a dataset with a held-out split (index.json in train/ and eval/) is replaced too, by either layout
    write_jsonl(tmp_path / "d.jsonl", DOCS * 4)
    for eval_fraction in (0.2, None, 0.0):
        build_shards([str(tmp_path / "d.jsonl")], tmp_path / "out", seq_len=8, overwrite=True,
                     eval_fraction=eval_fraction, verbose=False)
        assert (tmp_path / "out" / "train").is_dir() == (eval_fraction != 0.0)
        assert (tmp_path / "out" / "index.json").is_file() == (eval_fraction == 0.0)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("mine")
    with pytest.raises(DataBuildError, match="not an MDS dataset"):
        build_shards([str(tmp_path / "a.txt")], tmp_path / "other", seq_len=8, overwrite=True, verbose=False)


def test_workers_give_identical_shards(tmp_path):
    rows = [f"document {i}: " + "lorem ipsum " * (i % 17) for i in range(3000)]
    path = write_jsonl(tmp_path / "many.jsonl", rows)
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        stats = build_shards([str(path)], out, seq_len=64, workers=workers, size_limit=1 << 14, verbose=False)
        outs.append((out, stats))
    (a, sa), (b, sb) = outs
    assert sa == sb and sa["shards"] > 1 and sa["eval_documents"] == 60  # the default split: 2% of 3000
    names = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file() and p.name != "build.json")
    assert names == sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file() and p.name != "build.json")
    assert any(name.startswith("eval/") for name in names)
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_inspect_and_corruption(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", DOCS * 4)
    stats = build_shards([str(path)], tmp_path / "out", seq_len=8, size_limit=1 << 10, eval_fraction=0.0,
                         verbose=False)
    info = inspect(tmp_path / "out", sample=4, verbose=False)
    assert info["samples"] == stats["samples"] and info["shards"] == stats["shards"] > 2
    assert info["tokens"] == stats["samples"] * 9 and info["seq_len"] == 8
    assert info["eos"] == int((expected_stream(DOCS * 4)[0][:info["tokens"]] == EOS).sum())
    # sample 4 covers bytes 36..44: the end of the first document, its EOS, the next one
    assert DOCS[0][36:] == "." and info["sample_text"] == ".<eos>" + DOCS[1][:7]
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    shard = tmp_path / "out" / index["shards"][1]["zip_data"]["basename"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=shard.name):
        inspect(tmp_path / "out", verbose=False)
    shard.unlink()
    with pytest.raises(ShardError, match=f"{shard.name}: file missing"):
        inspect(tmp_path / "out", verbose=False)
    with pytest.raises(ShardError, match="no index.json"):
        inspect(tmp_path, verbose=False)


def test_inspect_checks_decompressed_copies(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", DOCS * 4)
    build_shards([str(path)], tmp_path / "out", seq_len=8, size_limit=1 << 10, eval_fraction=0.0, verbose=False)
    read_back(tmp_path / "out")  # the loader leaves decompressed shard.NNNNN.mds copies
    raw = tmp_path / "out" / "shard.00002.mds"
    assert raw.is_file()
    inspect(tmp_path / "out", verbose=False)
    data = bytearray(raw.read_bytes())
    data[-3] ^= 0xFF
    raw.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=r"shard\.00002\.mds: xxh64 hash mismatch"):
        inspect(tmp_path / "out", verbose=False)


def test_cli(tmp_path):
    app = typer.Typer()
    app.add_typer(data_app, name="data")
    runner = CliRunner()
    path = write_jsonl(tmp_path / "d.jsonl", DOCS, field="body")
    out = tmp_path / "out"
    res = runner.invoke(app, ["data", "build", str(path), "--out", str(out), "--seq-len", "8",
                              "--text-field", "body", "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert "documents" in res.output and "held out (eval/)" in res.output
    assert (out / "train" / "index.json").is_file() and (out / "eval" / "index.json").is_file()
    out = out / "train"
    res = runner.invoke(app, ["data", "inspect", str(out), "--sample", "2"])
    assert res.exit_code == 0, res.output
    assert "samples" in res.output and "sample 2" in res.output
    res = runner.invoke(app, ["data", "build", str(path), "--out", str(tmp_path / "o2"), "--seq-len", "8"])
    assert res.exit_code == 2 and "d.jsonl, line 1: no field 'text'" in res.output
    res = runner.invoke(app, ["data", "inspect", str(out), "--sample", "10000"])
    assert res.exit_code == 2 and "out of range" in res.output
