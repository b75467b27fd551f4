"""Typed configuration: nested dataclasses are the schema, one module per group with its checks.

    checks     ConfigError and the checks most keys need
    model      ModelConfig (`model.*`), with
      attention  AttentionConfig (`model.attention.*`), with each kind's own group:
        fsb        FsbConfig (`model.attention.fsb.*`, FS-B's read path)
        rewired    RewiredConfig (`model.attention.rewired.*`)
      argrc      ArgrcConfig (`model.argrc.*`)
    data       DataConfig, StreamConfig, MqarConfig, WarmupConfig (`data.*`)
    sources    the sources `data.source` names and what each reads (SOURCE_FACTS)
    optim      OptimConfig (`optim.*`);  loss: LossConfig (`loss.*`)
    parallel   ParallelConfig (`parallel.*`) and `check_world_size`
    train      TrainConfig (`train.*`), ResearchConfig (`research.*`)
    evaluation EvalConfig (`eval.*`)
    kinds      KindFacts, kind_facts: what validation knows of each `model.name` (no model imported)
    job        Config, the job assembled from the groups, and `validate`
    schema     SCHEMA_VERSION and the migration of saved configs of older versions
    yaml_io    load_config (job file + overrides), load_run_config (a run's config.yaml), to_yaml

A job is `YAML file -> dotted key=value overrides`, merged with omegaconf in strict mode onto
the dataclass defaults, so an unknown key or a value of the wrong type fails with the key's
name before any work starts; `validate()` then checks the relations between values (block size
a multiple of the cell size, window wide enough, positive learning rate, ...). Nothing here
imports torch, validation included (docs/config.md).
"""

from fsframework.config.argrc import ARGRC_CELLS, ARGRC_IDENTITIES, ArgrcConfig
from fsframework.config.attention import COMBINE_MODES, READOUT_BACKWARDS, READOUT_GAIN_PARAMS, AttentionConfig
from fsframework.config.checks import ConfigError
from fsframework.config.data import DataConfig, MqarConfig, StreamConfig, WarmupConfig
from fsframework.config.evaluation import EvalConfig
from fsframework.config.fsb import FSB_FORESTS, FsbConfig
from fsframework.config.job import Config, global_batch_sequences, validate
from fsframework.config.loss import LossConfig
from fsframework.config.model import ModelConfig
from fsframework.config.optim import OptimConfig
from fsframework.config.parallel import ParallelConfig, check_world_size
from fsframework.config.rewired import RewiredConfig
from fsframework.config.schema import SCHEMA_ADDED, SCHEMA_MIGRATIONS, SCHEMA_VERSION, migrate
from fsframework.config.train import PREEMPT_SIGNALS, ResearchConfig, TrainConfig
from fsframework.config.yaml_io import load_config, load_run_config, to_yaml

__all__ = [
    "ARGRC_CELLS", "ARGRC_IDENTITIES", "COMBINE_MODES", "FSB_FORESTS", "PREEMPT_SIGNALS", "READOUT_BACKWARDS",
    "READOUT_GAIN_PARAMS", "SCHEMA_ADDED", "SCHEMA_MIGRATIONS", "SCHEMA_VERSION",
    "ArgrcConfig", "AttentionConfig", "Config", "ConfigError", "DataConfig", "EvalConfig", "FsbConfig", "LossConfig",
    "ModelConfig", "MqarConfig", "OptimConfig", "ParallelConfig", "ResearchConfig", "RewiredConfig", "StreamConfig", "WarmupConfig",
    "TrainConfig", "check_world_size", "global_batch_sequences", "load_config", "load_run_config", "migrate", "to_yaml", "validate",
]
