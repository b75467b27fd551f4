"""The embedded corpus is cached under `data.cache_dir` in a directory keyed by everything its build
depends on (`seq<N>-<hash>`): another setting builds beside it, the same settings reuse it, and a
build becomes visible only once complete, so runs of different settings (or two at once) sharing
one cache directory never overwrite or half-read each other's shards."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fsframework.config import load_config
from fsframework.data import corpus, shards
from fsframework.data.loader import derived_data_location, embedded_corpus_location, prepare_data_dir
from fsframework.data.mixture import heldout_streams
from tests.utils import TINY_DATA


def tiny(cache: Path, *extra: str):
    return load_config(None, [f"data.cache_dir={cache}", *TINY_DATA, *extra])


def files(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under `root`: its modification time and bytes."""
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_another_length_builds_beside_and_leaves_the_first_untouched(tmp_path):
    # the layout before keyed builds: shards straight in the cache directory, ignored and kept
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "index.json").write_text("old layout")
    (tmp_path / "recipe.json").write_text("{}")
    old = files(tmp_path)

    first = Path(prepare_data_dir(tiny(tmp_path), "train")).parent
    assert re.fullmatch(r"seq64-[0-9a-f]{8}", first.name) and first.parent == tmp_path
    before = files(first)
    second = Path(prepare_data_dir(tiny(tmp_path, "data.seq_len=96"), "train")).parent
    assert re.fullmatch(r"seq96-[0-9a-f]{8}", second.name) and second.parent == tmp_path
    assert files(first) == before, "the first length's shards are untouched"
    assert (second / "train" / "index.json").is_file() and (second / "eval" / "index.json").is_file()
    assert {p.name for p in tmp_path.iterdir()} == {first.name, second.name, "train", "recipe.json"}  # no leftovers
    assert {k: v for k, v in files(tmp_path).items() if k in old} == old
    # any other setting the shards depend on gets a directory of its own too
    for change in ("data.embedded_retrieval_docs=41", "data.eval_fraction=0.05",
                   "data.embedded_retrieval_max_fraction=1.0", "data.embedded_python_chars=200001"):
        assert embedded_corpus_location(tiny(tmp_path, change)) not in (first, second), change
    # the batch size, shuffling or workers do not change the shards: same directory
    assert embedded_corpus_location(tiny(tmp_path, "data.micro_batch_size=3", "data.shuffle_seed=7")) == first


def test_the_same_settings_reuse_the_build(tmp_path, monkeypatch):
    cfg = tiny(tmp_path)
    train = prepare_data_dir(cfg, "train")
    root = Path(train).parent
    before = files(root)

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the corpus was rebuilt")

    monkeypatch.setattr(corpus, "embedded_documents", no_rebuild)
    assert prepare_data_dir(tiny(tmp_path), "train") == train
    assert files(root) == before
    # every reader resolves the same directory from the config: training, held-out streams (validation,
    # `fsf eval`, `fsf calibrate`), without building
    assert embedded_corpus_location(cfg) == root
    assert prepare_data_dir(cfg, "eval", build=False) == str(root / "eval")
    assert [s.location for s in heldout_streams(cfg)] == [str(root / "eval")]
    assert [s.location for s in heldout_streams(cfg, build=False)] == [str(root / "eval")]
    assert derived_data_location(cfg) == f"embedded corpus: {root}"  # as training prints it
    assert derived_data_location(tiny(tmp_path, f"data.streams=[{{path: {tmp_path / 'mine'}}}]")) is None


def test_a_half_written_build_is_never_read(tmp_path, monkeypatch):
    cfg = tiny(tmp_path)
    final = embedded_corpus_location(cfg)
    # what a build killed midway leaves: its temporary directory, partly written (another host's, so no
    # build here removes it: tests/data/test_partial_builds.py)
    leftover = tmp_path / f".{final.name}.building-12345-deadbeef@another-host"
    (leftover / "train").mkdir(parents=True)
    (leftover / "train" / "index.json").write_text('{"shards": [')

    # a build that fails midway leaves nothing under the name readers look at
    write_mds, failing = shards.write_mds, [True]

    def fail_on_eval(samples, out):
        if failing and Path(out).name == "eval":
            raise OSError("disk full")
        return write_mds(samples, out)

    monkeypatch.setattr(shards, "write_mds", fail_on_eval)
    with pytest.raises(OSError, match="disk full"):
        prepare_data_dir(cfg, "train")
    assert not final.exists()
    assert {p.name for p in tmp_path.iterdir()} == {leftover.name}, "the failed build's temporary directory is removed"

    failing.clear()
    train = Path(prepare_data_dir(cfg, "train"))
    assert train == final / "train" and (final / "recipe.json").is_file()
    assert (leftover / "train" / "index.json").read_text() == '{"shards": ['  # neither read nor reused


def test_of_two_racing_builds_the_second_uses_the_first(tmp_path, monkeypatch):
    cfg = tiny(tmp_path)
    documents = corpus.embedded_documents
    first = {}

    def another_build_finishes_first(*args, **kwargs):
        if not first:  # while this build runs, another one of the same settings completes
            first["root"] = None
            first["root"] = Path(prepare_data_dir(cfg, "train")).parent
            first["files"] = files(first["root"])
        return documents(*args, **kwargs)

    monkeypatch.setattr(corpus, "embedded_documents", another_build_finishes_first)
    train = prepare_data_dir(cfg, "train")
    root = embedded_corpus_location(cfg)
    assert first["root"] == root and train == str(root / "train")
    assert files(root) == first["files"], "the build that finished second left the first one's corpus as it was"
    assert [p.name for p in tmp_path.iterdir()] == [root.name], "the second build's directory is removed"
