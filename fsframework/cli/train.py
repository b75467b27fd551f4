"""`fsf train` and `fsf run`: train a config (and evaluate it)."""

from __future__ import annotations

import errno
import io
import os
import shutil
import time
from contextlib import contextmanager, redirect_stderr
from pathlib import Path
from typing import Callable, Iterator, List, Optional, TypeVar

import typer

from fsframework.checkpoints import CheckpointError, CheckpointWriteFailed, resolve_checkpoint
from fsframework.cli.common import (EXIT_BAD_INPUT, EXIT_RUN_FAILED, check_eval_tasks, fail, load_job_config,
                                    parents_are_directories, runtime)
from fsframework.config import ConfigError
from fsframework.config.kinds import check_trainable
from fsframework.parallel.health import RankFailure

T = TypeVar("T")
RANK_ZERO_FIRST_S = 5.0  # how long the other ranks wait for rank 0 to report a bad input and exit


def guarded(step: Callable[[], T]) -> T:
    """Run `step` (training, evaluation), mapping its errors to the exit codes: bad input
    (a checkpoint, data shard, missing file or invalid value) 2, a failed rank, a non-finite
    loss or a full disk 1; a run stopped by a signal exits with the code it chose (preempted: 75, which a
    SLURM batch script requeues on; SIGINT: 130), its message already printed."""
    rt = runtime()
    try:
        return step()
    except rt.preemption.RunStopped as exc:
        raise typer.Exit(exc.code) from None
    except KeyboardInterrupt:  # a second Ctrl-C: no wait for the step boundary
        fail("interrupted in the middle of a step; a rerun resumes from the newest complete checkpoint",
             code=rt.preemption.EXIT_INTERRUPTED)
    except (RankFailure, rt.nonfinite.NonFiniteLoss, CheckpointWriteFailed) as exc:
        # a rank failed while training, the loss diverged, or a checkpoint found no space
        fail(str(exc), code=EXIT_RUN_FAILED)
    except (CheckpointError, ConfigError, FileNotFoundError, rt.inspect_shards.ShardError) as exc:  # bad input
        fail(str(exc))
    except OSError as exc:  # after FileNotFoundError (bad input), itself an OSError
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # a log or metrics write on a full disk: what was written before stays readable
        fail(f"{exc.filename or 'a write'}: {exc.strerror}; the newest complete checkpoint is intact and a rerun "
             "resumes from it once there is space", code=EXIT_RUN_FAILED)


@contextmanager
def said_by_rank_zero() -> Iterator[None]:
    """Checks that every rank of a job makes alike (the config, the paths it names): their
    errors and warnings are printed by rank 0 alone, one line per job rather than one per rank.
    The other ranks exit with the same code, silently, and a few seconds late: torchrun stops
    the ranks still running when one ends, and rank 0 must have said why by then."""
    if os.environ.get("RANK", "0") == "0":
        yield
        return
    try:
        with redirect_stderr(io.StringIO()):
            yield
    except typer.Exit as exc:
        if exc.exit_code:
            time.sleep(RANK_ZERO_FIRST_S)  # cut short by the launcher's SIGTERM once rank 0 has ended
        raise


def trainable_config(config: Path, overrides: Optional[List[str]]):
    """The job's config; exits 2 when its model is a read path only (FS-B: train fs, read it with fsb),
    or when a path it names is of the wrong kind: run_dir a file, train.init_from missing."""
    with said_by_rank_zero():
        return _trainable_config(config, overrides)


def _trainable_config(config: Path, overrides: Optional[List[str]]):
    cfg = load_job_config(config, overrides)
    try:
        check_trainable(cfg.model.name)
    except ConfigError as exc:
        fail(str(exc))
    if Path(cfg.run_dir).is_file():
        fail(f"run_dir {cfg.run_dir}: is a file, not a run directory")
    parents_are_directories(Path(cfg.run_dir), "run_dir")
    if cfg.train.init_from:
        initial_checkpoint(Path(cfg.train.init_from))
    return cfg


def initial_checkpoint(path: Path) -> None:
    """`train.init_from`: a weights file, or a directory holding a complete checkpoint (found
    before the engine is built: a run dir or an export of any size is named in one line)."""
    if not path.exists():
        fail(f"train.init_from {path}: not found")
    if path.is_dir():
        try:
            resolve_checkpoint(path)
        except CheckpointError as exc:
            fail(f"train.init_from {path}: {exc}")


@contextmanager
def no_run_dir_left_on_bad_input(run_dir: Path) -> Iterator[None]:
    """A run that this command started in a new directory and that fails on bad input before
    its first checkpoint leaves no directory behind (the checks before any work catch most bad
    input; this catches what only the engine finds, e.g. an init_from of another model)."""
    existed = run_dir.exists()
    try:
        yield
    except typer.Exit as exc:
        made_here = not existed and os.environ.get("RANK", "0") == "0"  # rank 0 made it
        if exc.exit_code == EXIT_BAD_INPUT and made_here and not any(run_dir.glob("checkpoints/*/")):
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def train(config: Path = typer.Argument(..., help="YAML job file"),
          overrides: Optional[List[str]] = typer.Argument(None, help="dotted key=value overrides")) -> None:
    """Train (or resume, when the run directory holds a checkpoint) the model of CONFIG.

    Example: fsf train yamls/quickstart.yaml train.max_steps=50 run_dir=runs/try
    """
    cfg = trainable_config(config, overrides)
    rt = runtime()
    with rt.process_group.multi_rank_job(), no_run_dir_left_on_bad_input(Path(cfg.run_dir)):
        guarded(lambda: rt.trainer.train(cfg))


def run(config: Path = typer.Argument(..., help="YAML job file"),
        overrides: Optional[List[str]] = typer.Argument(None, help="dotted key=value overrides")) -> None:
    """The main job: train CONFIG, evaluate the result, print a summary table.

    Example: fsf run yamls/quickstart.yaml
    """
    cfg = trainable_config(config, overrides)
    rt = runtime()
    guarded(lambda: check_eval_tasks(list(cfg.eval.tasks), cfg.eval.ruler_data))
    heldout = [task for task in cfg.eval.tasks if task in ("perplexity", "doc_perplexity")]
    if heldout:  # found missing before training, not after it
        guarded(lambda: rt.loader.check_data_fits(cfg, heldout_for=f"eval.tasks={heldout[0]}"))
    with rt.process_group.multi_rank_job():
        with no_run_dir_left_on_bad_input(Path(cfg.run_dir)):
            guarded(lambda: rt.trainer.train(cfg))
        scores = guarded(lambda: rt.runner.evaluate_checkpoint(
            Path(cfg.run_dir), tasks=list(cfg.eval.tasks), lengths=None, num_samples=cfg.eval.num_samples,
            batch_size=None, seed=cfg.train.seed, out=None, overrides=[]))
    rt.runner.summary_table(Path(cfg.run_dir), scores)
