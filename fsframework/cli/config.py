"""`fsf config`: validate a job file and print the resolved config."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from fsframework.cli.common import load_job_config
from fsframework.config import to_yaml


def config(config: Path = typer.Argument(..., help="YAML job file"),
           overrides: Optional[List[str]] = typer.Argument(None, help="dotted key=value overrides")) -> None:
    """Validate CONFIG with overrides and print the resolved YAML.

    Example: fsf config yamls/quickstart.yaml model.name=swa parallel.sp=2
    """
    typer.echo(to_yaml(load_job_config(config, overrides)))
