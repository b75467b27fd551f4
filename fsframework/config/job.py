"""The job config, assembled from the groups' own configs, and its validation: each group checks
its keys (and how they fit the groups they depend on) in its own module."""

from __future__ import annotations

from dataclasses import dataclass, field

from fsframework.config.checks import ConfigError
from fsframework.config.data import DataConfig, check_data
from fsframework.config.evaluation import EvalConfig, check_eval
from fsframework.config.loss import LossConfig, check_loss
from fsframework.config.schema import SCHEMA_VERSION
from fsframework.config.model import ModelConfig, check_model
from fsframework.config.optim import OptimConfig, check_optim
from fsframework.config.parallel import ParallelConfig, check_parallel
from fsframework.config.train import ResearchConfig, TrainConfig, check_research, check_train


@dataclass
class Config:
    schema_version: int = SCHEMA_VERSION  # see fsframework.config.schema; written into every saved config
    run_dir: str = "runs/default"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    research: ResearchConfig = field(default_factory=ResearchConfig)


def global_batch_sequences(cfg: Config, world_size: int) -> int:
    """Sequences one optimizer step trains on `world_size` ranks: a rank's micro-batch x the accumulated
    micro-batches x the data-parallel size (the ranks of a sequence-parallel group share their rows;
    at least one group)."""
    return cfg.data.micro_batch_size * cfg.parallel.grad_accum * max(world_size // cfg.parallel.sp, 1)


def validate(cfg: Config) -> Config:
    """Check relations between values; raise ConfigError naming the key and what is allowed.
    Imports no torch (the model kinds come from the table of kind facts, `fsframework.config.kinds`)."""
    if cfg.schema_version != SCHEMA_VERSION:
        raise ConfigError(f"schema_version={cfg.schema_version} is not this version's {SCHEMA_VERSION}: a run's "
                          "saved config.yaml of an older version is migrated when the run is read back "
                          "(fsf eval, resume, train.init_from); a job file needs no schema_version")
    check_model(cfg.model)
    check_data(cfg)
    check_optim(cfg.optim)
    check_loss(cfg.loss)
    check_parallel(cfg.parallel)
    check_train(cfg)
    check_research(cfg)
    check_eval(cfg.eval)
    return cfg
