"""What every `fsf` command shares: the one way to fail, and the config loader.

Exit codes, the same for every command: `EXIT_BAD_INPUT` (2) when the input is wrong (a config
error, a missing file, a bad checkpoint or data shard, bad launch options; typer's own usage
errors are 2 as well) and `EXIT_RUN_FAILED` (1) when a run started and failed (a rank failed,
a conversion does not reproduce its checkpoint).
"""

from __future__ import annotations

from pathlib import Path
from typing import List, NoReturn, Optional

import typer

EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 1


def flag(help: str, *names: str):
    """A boolean option shown as a bare flag in the help (typer would print `<bool>` after it)."""
    return typer.Option(False, *names, help=help, metavar="")


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print `error: MESSAGE` to stderr and exit with `code`."""
    from rich.console import Console
    from rich.markup import escape

    # escaped: messages quote paths and library errors, e.g. gloo's "[/path/file.cc:129]",
    # which rich would otherwise read as markup and fail on, hiding the real error
    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def load_job_config(config: Optional[Path], overrides: Optional[List[str]]):
    """The validated Config of a job file with dotted overrides; exits 2 naming the bad key.

    The config.yaml of a run directory (one holding checkpoints/, e.g. to resume the run) is
    read as the run saved it: older schema versions are migrated (`fsframework.config.migrate`)."""
    from fsframework.checkpoints import RunDir, read_config
    from fsframework.config import ConfigError, load_config

    try:
        if config is not None and RunDir.holding_config(config) is not None:
            return read_config(config, overrides or [])
        return load_config(config, overrides or [])
    except ConfigError as exc:
        fail(str(exc))
