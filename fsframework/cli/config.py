"""`fsf config`: validate a job file and print the resolved config and what it adds up to."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer

from fsframework.cli.common import load_job_config
from fsframework.config import Config, global_batch_sequences, to_yaml


def derived_figures(cfg: Config, world_size: int, parameters: int) -> list[str]:
    """What a user checks before a long job, as YAML comment lines: ranks, global batch in sequences
    and tokens, parameters, steps and tokens in all."""
    dp = max(world_size // cfg.parallel.sp, 1)
    sequences = global_batch_sequences(cfg, world_size)
    tokens = sequences * cfg.data.seq_len
    return [f"# world size {world_size} ({dp} data-parallel x {cfg.parallel.sp} sequence-parallel; "
            "the launcher sets it: fsf launch --nodes N --gpus-per-node G)",
            f"# global batch {sequences:,} sequences = {tokens:,} tokens a step "
            f"({cfg.data.micro_batch_size} a rank x {cfg.parallel.grad_accum} accumulated x {dp} data-parallel)",
            f"# parameters {parameters:,}",
            f"# {cfg.train.max_steps:,} steps, {cfg.train.max_steps * tokens:,} tokens in all"]


def config(config: Path = typer.Argument(..., help="YAML job file"),
           overrides: Optional[List[str]] = typer.Argument(None, help="dotted key=value overrides")) -> None:
    """Validate CONFIG with overrides and print the resolved YAML and what it adds up to.

    After the YAML, as comments: world size, global batch in sequences and tokens, parameters,
    steps and tokens in all.

    Example: fsf config yamls/quickstart.yaml model.name=swa parallel.sp=2
    """
    cfg = load_job_config(config, overrides)
    typer.echo(to_yaml(cfg).rstrip("\n"))
    import torch  # the parameter count builds the model on the meta device (no memory)

    from fsframework.models.registry import build_model, count_parameters  # torch: `fsf --help` starts without it

    with torch.device("meta"):
        model = build_model(cfg.model)
    for line in derived_figures(cfg, int(os.environ.get("WORLD_SIZE", "1")), count_parameters(model)):
        typer.echo(line)

