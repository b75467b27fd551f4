"""Sources as a table: `data.source` names a source (`fsframework.config.sources` says what each
reads), `fsframework.data.source_table` builds it and wraps it; a new source or wrapper is a
registered row; a saved config of schema 4 that named shards by their path reads as
`data.source=shards` with `data.path`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml

from fsframework.config import Config, ConfigError, load_config, load_run_config, migrate, to_yaml
from fsframework.config import sources as source_facts
from fsframework.config.sources import SourceFacts
from fsframework.data import source_table
from fsframework.data.source_table import SourceContext, build_source, register_source, register_wrapper
from fsframework.data.sources import StreamSource, WrappedSource
from tests.utils import REPO

LIBRARY = REPO / "fsframework"
# the modules that know the sources by name
SOURCE_MODULES = {LIBRARY / "config" / "sources.py", LIBRARY / "data" / "source_table.py"}


@pytest.fixture
def tables():
    """The source tables as they are, restored after the test (a registration is process-wide)."""
    saved = dict(source_table.SOURCES), dict(source_table.WRAPPERS), dict(source_facts.SOURCE_FACTS)
    yield
    for table, before in zip((source_table.SOURCES, source_table.WRAPPERS, source_facts.SOURCE_FACTS), saved):
        table.clear()
        table.update(before)


class Counting(StreamSource):
    """Rows 0, 1, 2, ... each filled with its index."""

    def __init__(self, width: int):
        self.width, self.served = width, 0

    def __next__(self):
        row = torch.full((1, self.width), self.served)
        self.served += 1
        return {"inputs": row, "targets": row}

    def state_dict(self):
        return {"served": self.served}

    def load_state_dict(self, state):
        self.served = state["served"]

    def close(self):
        pass


class Doubled(WrappedSource):
    def next_batch(self, step, micro):
        batch = self.inner.next_batch(step, micro)
        return {key: 2 * value for key, value in batch.items()}


def _context(tmp_path: Path) -> SourceContext:
    return SourceContext(streams=[], dp_rank=0, rank=0, data_cache=tmp_path)


def test_a_registered_source_is_a_valid_data_source_and_is_built(tables, tmp_path):
    with pytest.raises(ConfigError, match="data.source='counting' is not a source; choose one of embedded, shards"):
        load_config(None, ["data.source=counting"])
    register_source("counting", lambda cfg, ctx: Counting(cfg.data.seq_len))
    cfg = load_config(None, ["data.source=counting", "data.seq_len=8"])
    source = build_source(cfg, _context(tmp_path))
    assert [int(source.next_batch(step, 0)["inputs"][0, 0]) for step in range(3)] == [0, 1, 2]
    assert not source_facts.reads_text(cfg), "a registered source generates its rows unless its facts say otherwise"


def test_a_registered_wrapper_wraps_every_source_outermost(tables, tmp_path):
    register_source("counting", lambda cfg, ctx: Counting(4))
    register_wrapper("doubled", lambda cfg, source, ctx: Doubled(source) if cfg.data.seq_len == 8 else None)
    assert list(source_table.WRAPPERS)[-1] == "doubled"
    source = build_source(load_config(None, ["data.source=counting", "data.seq_len=8"]), _context(tmp_path))
    assert isinstance(source, Doubled)
    assert [int(source.next_batch(step, 0)["inputs"][0, 0]) for step in range(3)] == [0, 2, 4]
    # a wrapper that returns None leaves the source as it is
    plain = build_source(load_config(None, ["data.source=counting", "data.seq_len=16"]), _context(tmp_path))
    assert isinstance(plain, Counting)


def test_the_induction_warmup_is_a_wrapper_the_config_turns_on(tmp_path):
    from fsframework.data.warmups import InductionWarmup

    cfg = load_config(REPO / "yamls" / "mqar-cpu.yaml", ["data.warmup.steps=3"])
    assert isinstance(build_source(cfg, _context(tmp_path)), InductionWarmup)
    cfg = load_config(REPO / "yamls" / "mqar-cpu.yaml", ["data.warmup.steps=0"])
    assert not isinstance(build_source(cfg, _context(tmp_path)), InductionWarmup)


def test_every_source_has_facts_and_a_builder():
    assert set(source_table.SOURCES) == set(source_facts.SOURCE_FACTS) == {"embedded", "shards", "mqar"}


@pytest.mark.parametrize("overrides, message", [
    (["data.source=fineweb"], "data.source='fineweb' is not a source; choose one of embedded, shards, mqar"),
    (["data.source=data/fineweb-edu-4k"],
     "data.source='data/fineweb-edu-4k' is a path: data.source names a source, write data.source=shards "
     "data.path=data/fineweb-edu-4k"),
    (["data.source=s3://bucket/shards"], "write data.source=shards data.path=s3://bucket/shards"),
    (["data.source=shards"], "data.source=shards reads the data at data.path, which is not set"),
    (["data.source=mqar", "data.streams=[{path: data/x}]", "train.eval_every=0"],
     "data.source=mqar generates its data: remove data.streams"),
])
def test_a_wrong_source_or_path_fails_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as error:
        load_config(REPO / "yamls" / "quickstart.yaml", overrides)
    assert message in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_shards_read_the_path_and_other_sources_ignore_it():
    cfg = load_config(None, ["data.source=shards", "data.path=data/x"])
    assert (cfg.data.source, cfg.data.path) == ("shards", "data/x") and source_facts.reads_text(cfg)
    assert source_facts.data_path(cfg) == "data/x"
    # a job on shards switched to the built-in corpus by an override: its path is not read
    cfg = load_config(REPO / "yamls" / "argrc-wt2.yaml", ["data.source=embedded"])
    assert cfg.data.path == "data/wt2-512" and source_facts.data_path(cfg) == ""


def _schema_4(tmp_path: Path, data: dict) -> Path:
    """A config.yaml as schema 4 saved it, with `data` as its data section."""
    saved = yaml.safe_load(to_yaml(Config()))  # today's keys; schema 4 had all but data.path
    saved["schema_version"] = 4
    del saved["data"]["path"]
    saved["data"].update(data)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(saved))
    return path


def test_a_schema_4_path_source_is_migrated_to_shards_and_its_path(tmp_path):
    cfg = load_run_config(_schema_4(tmp_path, {"source": "data/fineweb-edu-4k"}))
    assert (cfg.schema_version, cfg.data.source, cfg.data.path) == (5, "shards", "data/fineweb-edu-4k")
    assert migrate({"schema_version": 4, "data": {"source": "s3://bucket/x"}})["data"] == {
        "source": "shards", "path": "s3://bucket/x"}
    for name in ("embedded", "mqar"):  # schema 4's names stay names
        assert migrate({"schema_version": 4, "data": {"source": name}})["data"] == {"source": name}
    assert migrate({"schema_version": 4}) == {"schema_version": 5}
    # a job file is written in the current schema: the old form is refused, naming the new one
    job = tmp_path / "job.yaml"
    job.write_text("data:\n  source: data/fineweb-edu-4k\n")
    with pytest.raises(ConfigError, match="write data.source=shards data.path=data/fineweb-edu-4k"):
        load_config(job)


def test_a_schema_4_mixture_names_each_dataset_by_its_path(tmp_path):
    streams = [{"source": "data/prose", "proportion": 3}, {"source": "s3://bucket/digits", "proportion": None}]
    cfg = load_run_config(_schema_4(tmp_path, {"streams": streams}))
    assert [(s.path, s.proportion) for s in cfg.data.streams] == [("data/prose", 3), ("s3://bucket/digits", None)]
    assert cfg.data.source == "embedded", "the mixture replaces the default source, as before"
    expected = "config key data.streams[].source moved to data.streams[].path in schema_version 5"
    for overrides in (["data.streams=[{source: data/prose}]"],
                      ["data.streams=[{path: data/prose}, {source: data/digits, proportion: 1}]"]):
        with pytest.raises(ConfigError, match=re.escape(expected)):
            load_config(None, overrides)
    job = tmp_path / "job.yaml"
    job.write_text("data:\n  streams:\n  - source: data/prose\n")
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_config(job)


def test_no_module_but_the_source_modules_compares_data_source():
    """The trainer, the loader, evaluation and export ask the source's facts; none of them holds
    a branch on a source's name (`.source == ...`, `source in (...)`)."""
    found = []
    for path in sorted(LIBRARY.rglob("*.py")):
        if path in SOURCE_MODULES:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\.source\b\s*[=!]=|source in \(", line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
    trainer = (LIBRARY / "train" / "trainer.py").read_text()
    assert not [name for name in source_table.SOURCES if re.search(rf"\b{name}\b", trainer)], \
        "the trainer names no source"
    assert "make_source" not in trainer
