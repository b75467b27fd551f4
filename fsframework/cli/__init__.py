"""`fsf`: the command line of fsframework. Each command builds its inputs and calls one function.

One module per command group registers its commands here; they share `fsframework.cli.common`
(the error helper, the exit codes and the config loader) and import nothing from each other.
"""

from __future__ import annotations

import sys

import typer

from fsframework import __version__, quiet
from fsframework.cli import calibrate as _calibrate
from fsframework.cli import config as _config
from fsframework.cli import eval as _eval
from fsframework.cli import export as _export
from fsframework.cli import generate as _generate
from fsframework.cli import info as _info
from fsframework.cli import launch as _launch
from fsframework.cli import runs as _runs
from fsframework.cli import train as _train
from fsframework.cli.common import BareFlagsCommand, BareFlagsGroup
from fsframework.cli.data import data_app

# markdown: a docstring's line breaks are spaces, so descriptions wrap at the terminal's width
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode="markdown", cls=BareFlagsGroup,
                  help="Train, evaluate and serve long-context language models (FreeSolo, AR-GRC, rewired attention)."
                       "\n\nExample: fsf run yamls/quickstart.yaml")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"fsframework {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", help="print the version and exit", metavar="",
                                          callback=_print_version, is_eager=True)) -> None:
    quiet.start()  # before any command imports torch, DeepSpeed or streaming (fsframework.quiet)

app.add_typer(data_app, name="data", cls=BareFlagsGroup, help="Build and inspect tokenized MDS shards.\n\n"
                                         "Example: fsf data build notes.txt --out shards/")
app.command("train")(_train.train)
app.command("eval")(_eval.evaluate)
app.command("generate")(_generate.generate)
app.command("run")(_train.run)
app.command("export")(_export.export)
app.command("convert")(_export.convert)  # alias of export
app.command("import")(_export.import_)
app.command("info")(_info.info)
app.command("config")(_config.config)
app.command("launch")(_launch.launch_command)
app.command("calibrate")(_calibrate.calibrate)
app.command("runs")(_runs.runs)
for _registered in (*app.registered_commands, *data_app.registered_commands):
    if _registered.cls in (None, typer.core.TyperCommand):  # typer's default: its help shows `<bool>`
        _registered.cls = BareFlagsCommand


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
