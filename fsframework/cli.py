"""`fsf`: the command line of fsframework. Each command builds its inputs and calls one function."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Train, evaluate and serve long-context language models (FreeSolo, AR-GRC, rewired attention).")


def _mount_subcommands() -> None:
    from fsframework.cli_data import data_app

    app.add_typer(data_app, name="data", help="Build and inspect tokenized MDS shards.")


_mount_subcommands()


def _fail(message: str, code: int = 2) -> None:
    from rich.console import Console
    from rich.markup import escape

    # escaped: messages quote paths and library errors, e.g. gloo's "[/path/file.cc:129]",
    # which rich would otherwise read as markup and fail on, hiding the real error
    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def _load(config: Optional[Path], overrides: Optional[List[str]]):
    from fsframework.config import ConfigError, load_config

    try:
        return load_config(config, overrides or [])
    except ConfigError as exc:
        _fail(str(exc))


@app.command()
def train(config: Path = typer.Argument(..., help="YAML job file"),
          overrides: Optional[List[str]] = typer.Argument(None, help="dotted key=value overrides")) -> None:
    """Train (or resume, when the run directory holds a checkpoint) the model of CONFIG."""
    cfg = _load(config, overrides)
    from fsframework.train.checkpoint import CheckpointError
    from fsframework.train.trainer import train as run_training

    from fsframework.data.inspect_shards import ShardError
    from fsframework.parallel.health import RankFailure

    try:
        run_training(cfg)
    except (CheckpointError, FileNotFoundError, ShardError) as exc:  # bad input
        _fail(str(exc))
    except RankFailure as exc:  # a rank failed while training
        _fail(str(exc), code=1)


@app.command("eval")
def evaluate(checkpoint: Path = typer.Argument(..., help="run directory or checkpoint directory"),
             tasks: str = typer.Option("perplexity", help="comma-separated task names"),
             lengths: Optional[str] = typer.Option(None, help="comma-separated lengths (default: eval.lengths)"),
             num_samples: int = typer.Option(10, help="samples per task and length"),
             batch_size: int = typer.Option(0, help="0: eval.batch_size of the checkpoint's config"),
             seed: int = typer.Option(0),
             out: Optional[Path] = typer.Option(None, help="JSON file of scores (default <run>/eval/scores.json)"),
             overrides: Optional[List[str]] = typer.Argument(None, help="config overrides, e.g. model.attention.impl=reference")) -> None:
    """Evaluate a checkpoint: perplexity vs length and long-context retrieval tasks."""
    from fsframework.eval.runner import evaluate_checkpoint
    from fsframework.train.checkpoint import CheckpointError

    try:
        evaluate_checkpoint(checkpoint, tasks=[t.strip() for t in tasks.split(",") if t.strip()],
                            lengths=[int(x) for x in lengths.split(",")] if lengths else None,
                            num_samples=num_samples, batch_size=batch_size or None, seed=seed, out=out,
                            overrides=overrides or [])
    except (CheckpointError, ValueError) as exc:
        _fail(str(exc))


@app.command()
def run(config: Path = typer.Argument(..., help="YAML job file"),
        overrides: Optional[List[str]] = typer.Argument(None, help="dotted key=value overrides")) -> None:
    """The main job: train CONFIG, evaluate the result, print a summary table."""
    cfg = _load(config, overrides)
    from fsframework.eval.runner import evaluate_checkpoint, summary_table
    from fsframework.train.trainer import train as run_training

    run_training(cfg)
    scores = evaluate_checkpoint(Path(cfg.run_dir), tasks=list(cfg.eval.tasks), lengths=None,
                                 num_samples=cfg.eval.num_samples, batch_size=None, seed=cfg.train.seed, out=None,
                                 overrides=[])
    summary_table(Path(cfg.run_dir), scores)


@app.command()
def convert(checkpoint: Path = typer.Argument(..., help="run directory or checkpoint directory")) -> None:
    """Consolidate a (ZeRO-sharded) checkpoint into one fp32 file, with a logit-equality proof."""
    from fsframework.train.checkpoint import CheckpointError
    from fsframework.train.convert import convert_to_fp32

    try:
        out, diff = convert_to_fp32(checkpoint)
    except CheckpointError as exc:
        _fail(str(exc))
    typer.echo(f"wrote {out} (max |logit difference| vs the engine checkpoint: {diff:.3g})")
    if diff != 0.0:
        _fail("converted weights do not reproduce the checkpoint's logits", code=1)


@app.command()
def info() -> None:
    """Versions of the engines, devices, and whether Triton kernels can run."""
    from fsframework.info import collect_info, print_info

    print_info(collect_info())


@app.command()
def config(config: Path = typer.Argument(..., help="YAML job file"),
           overrides: Optional[List[str]] = typer.Argument(None)) -> None:
    """Validate CONFIG with overrides and print the resolved YAML."""
    from fsframework.config import to_yaml

    typer.echo(to_yaml(_load(config, overrides)))


from fsframework.cli_launch import launch_command  # noqa: E402  (after the app, which it extends)

app.command("launch")(launch_command)


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
