"""What every `fsf` command shares: the one way to fail, the checks of the paths it is given, and
the config loader.

Paths: each command checks every path argument before any work, with `input_file`, `input_dir`
(`checkpoint_dir`), `output_file` and `output_dir`: a missing path, one of the wrong kind (a file where a folder is
expected, or the reverse) or an occupied output ends in one line naming the option and the path,
exit code 2, and nothing written.

Exit codes, the same for every command: `EXIT_BAD_INPUT` (2) when the input is wrong (a config
error, a missing file, a bad checkpoint or data shard, bad launch options; typer's own usage
errors are 2 as well) and `EXIT_RUN_FAILED` (1) when a run started and failed (a rank failed,
a conversion does not reproduce its checkpoint).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import List, NoReturn, Optional

import typer

from fsframework.checkpoints import RunDir, read_config
from fsframework.config import ConfigError, load_config
from fsframework.eval.ruler import RULER_TASKS, SUITE, check_qa_files

EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 1
# what `fsf eval --tasks` and `eval.tasks` take: the names `fsframework.eval.suite.TASKS` runs and "ruler"
# for the 13 RULER tasks, from the light modules (the CLI starts without torch)
TASK_NAMES = (SUITE, *RULER_TASKS, "passkey", "ffact", "perplexity", "doc_perplexity", "mqar")


def runtime():
    """`fsframework.cli.runtime`: the modules the commands run (numpy, torch, the models), imported
    on a command's first use of them."""
    from fsframework.cli import runtime as modules  # torch: `fsf --help` and config errors start without it

    return modules


def flag(help: str, *names: str):
    """A boolean option shown as a bare flag in the help (typer would print `<bool>` after it)."""
    return typer.Option(False, *names, help=help, metavar="")


class _BareFlags:
    """A command whose help shows every boolean flag bare, its own `--help` included: typer prints
    a flag's type, `<bool>`, in the column of the values an option takes, and a flag takes none."""

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:
            if getattr(param, "is_bool_flag", False) and param.metavar is None:
                param.metavar = ""
        return params


class BareFlagsCommand(_BareFlags, typer.core.TyperCommand):
    pass


class BareFlagsGroup(_BareFlags, typer.core.TyperGroup):
    pass


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print `error: MESSAGE` to stderr and exit with `code`."""
    from rich.console import Console
    from rich.markup import escape

    # escaped: messages quote paths and library errors, e.g. gloo's "[/path/file.cc:129]",
    # which rich would otherwise read as markup and fail on, hiding the real error
    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def input_file(path: Path, what: str) -> Path:
    """`path`, a file the command reads; exits 2 when it is missing or a directory."""
    if not path.exists():
        fail(f"{what} {path}: not found")
    if path.is_dir():
        fail(f"{what} {path}: is a directory, not a file")
    return path


def input_dir(path: Path, what: str, kind: str = "a directory") -> Path:
    """`path`, a directory the command reads (`kind` says which, for the message); exits 2 when
    it is missing or a file."""
    if not path.exists():
        fail(f"{what} {path}: not found")
    if not path.is_dir():
        fail(f"{what} {path}: is a file, not {kind}")
    return path


def checkpoint_dir(path: Path) -> Path:
    """`path`, a run, checkpoint or export directory (which one holds a checkpoint is
    `fsframework.checkpoints.resolve_checkpoint`'s to say); exits 2 when it is missing or a file."""
    return input_dir(path, "checkpoint", "a run, checkpoint or export directory")


def output_dir(path: Path, what: str, remedy: str = "name a new directory") -> Path:
    """`path`, a directory the command creates: it may exist only as an empty directory (what
    is in it would be mixed with the output); exits 2 otherwise, or when a parent is a file."""
    if path.exists() and not path.is_dir():
        fail(f"{what} {path}: is a file; {remedy}")
    if path.is_dir() and any(path.iterdir()):
        fail(f"{what} {path}: exists and is not empty; {remedy}")
    parents_are_directories(path, what)
    return path


def output_file(path: Path, what: str, *, replace: bool) -> Path:
    """`path`, a file the command writes; exits 2 when it is a directory, when a parent is a
    file, or, unless `replace` (a file rewritten by design, e.g. scores), when it exists."""
    if path.is_dir():
        fail(f"{what} {path}: is a directory; name a file to write")
    if path.exists() and not replace:
        fail(f"{what} {path}: exists; name a new file")
    parents_are_directories(path, what)
    return path


def parents_are_directories(path: Path, what: str) -> None:
    """Exits 2 when `path` cannot be made: the nearest existing parent is a file, or no directory
    can be created in it (read-only, no permission, a virtual file system such as /proc)."""
    if path.is_dir():
        return
    existing = next(parent for parent in path.absolute().parents if parent.exists())
    if not existing.is_dir():
        fail(f"{what} {path}: {existing} is a file, not a directory")
    try:  # the one sure test of creating a directory there; removed at once
        os.rmdir(tempfile.mkdtemp(prefix=".fsf-write-check-", dir=existing))
    except OSError as exc:
        fail(f"{what} {path}: cannot create a directory in {existing} ({exc.strerror})")


def load_job_config(config: Optional[Path], overrides: Optional[List[str]]):
    """The validated Config of a job file with dotted overrides; exits 2 naming the bad key.

    The config.yaml of a run directory (one holding checkpoints/, e.g. to resume the run) is
    read as the run saved it: older schema versions are migrated (`fsframework.config.migrate`)."""
    if config is not None and config.is_dir():  # a missing file is the config loader's to name
        fail(f"config file {config}: is a directory, not a YAML job file")
    try:
        if config is not None and RunDir.holding_config(config) is not None:
            return read_config(config, overrides or [])
        return load_config(config, overrides or [])
    except ConfigError as exc:
        fail(str(exc))


def check_eval_tasks(tasks: list[str], ruler_data) -> None:
    """`eval.tasks` of a job, checked before `fsf run` trains (a typo found after training would
    cost the run): known names, and the files of the QA tasks it will run (`check_qa_files`:
    QADataMissing, a FileNotFoundError, names the file and where to put it)."""
    unknown = [t for t in tasks if t not in TASK_NAMES]
    if unknown:
        raise ConfigError(f"eval.tasks: unknown {', '.join(map(str, unknown))}; choose from {', '.join(TASK_NAMES)}")
    check_qa_files(tasks, ruler_data)
