"""The `fsf` package: one exit-code convention (2 bad input, 1 failed run) and its import graph."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fsframework.cli import app
from fsframework.cli.common import EXIT_BAD_INPUT, EXIT_RUN_FAILED
from tests.utils import REPO, TINY_DATA, TINY_MODEL, run_fsf

runner = CliRunner()


def test_exit_codes():
    assert (EXIT_BAD_INPUT, EXIT_RUN_FAILED) == (2, 1)


def test_fail_prints_the_message_and_exits_with_the_code():
    import typer

    from fsframework.cli.common import fail

    demo = typer.Typer()

    @demo.command()
    def go(code: int = 2) -> None:
        fail("bad [/thing]", code=code)

    for code in (EXIT_BAD_INPUT, EXIT_RUN_FAILED):
        res = runner.invoke(demo, ["--code", str(code)])
        assert res.exit_code == code and "error: bad [/thing]" in res.output


@pytest.mark.parametrize("command", ["eval", "convert", "export"])
def test_a_missing_or_empty_checkpoint_is_bad_input(command, tmp_path):
    out = [str(tmp_path / "out")] if command == "export" else []  # export names its output
    res = runner.invoke(app, [command, str(tmp_path / "nowhere"), *out])
    assert res.exit_code == EXIT_BAD_INPUT and "nowhere: not found" in res.output
    res = runner.invoke(app, [command, str(tmp_path), *out])
    assert res.exit_code == EXIT_BAD_INPUT and "no complete checkpoint under" in res.output


def test_a_config_error_is_bad_input_for_every_config_command(tmp_path):
    for command in (["train"], ["run"], ["config"], ["launch", "--dry-run"]):
        res = runner.invoke(app, [*command, str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={tmp_path}",
                                  "optim.lrr=1"])
        assert res.exit_code == EXIT_BAD_INPUT and "optim.lrr" in res.output, command
    res = runner.invoke(app, ["config", str(tmp_path / "missing.yaml")])
    assert res.exit_code == EXIT_BAD_INPUT and "config file not found" in res.output


@pytest.mark.parametrize("command", ["export", "convert"])
def test_a_conversion_that_does_not_reproduce_its_logits_is_a_failed_run(command, tmp_path, monkeypatch):
    import fsframework.export as export

    def fails(*_args, **_kwargs):
        raise export.ProofFailed("the exported weights do not reproduce the checkpoint's logits")

    monkeypatch.setattr(export, "export_checkpoint", fails)
    res = runner.invoke(app, [command, str(tmp_path), str(tmp_path / "out")])
    assert res.exit_code == EXIT_RUN_FAILED and "do not reproduce" in res.output


def test_a_failing_rank_is_a_failed_run(tmp_path, data_cache, monkeypatch):
    from tests.faults import inject

    inject(monkeypatch, "raise:0:1")
    proc = run_fsf("train", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={tmp_path / 'run'}",
                   f"data.cache_dir={data_cache}", *TINY_DATA, *TINY_MODEL, "model.name=tfpp", "train.max_steps=2",
                   "train.progress=false", "train.tensorboard=false", check=False)
    assert proc.returncode == EXIT_RUN_FAILED and "injected fault at step 1" in proc.stderr


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _imports_any(paths, prefixes: tuple[str, ...]) -> list[str]:
    return sorted(f"{path.relative_to(REPO)}: {name}" for path in paths for name in _imports(path)
                  if name.startswith(prefixes))


def test_import_graph_of_the_cli_checkpoints_and_eval():
    pkg = REPO / "fsframework"
    # the launcher is below the CLI; the command modules share only cli.common
    assert _imports_any(sorted((pkg / "launcher").glob("*.py")), ("fsframework.cli",)) == []
    commands = [p for p in sorted((pkg / "cli").glob("*.py")) if p.name not in ("__init__.py", "common.py")]
    assert [name for name in _imports_any(commands, ("fsframework.cli",)) if "fsframework.cli.common" not in name] == []
    # checkpoints sit below eval: no train, eval, cli or data; only the writing side, whose save is
    # collective, uses the process group
    checkpoints = sorted((pkg / "checkpoints").glob("*.py"))
    assert pkg / "checkpoints" / "writing.py" in checkpoints
    assert _imports_any(checkpoints, tuple(f"fsframework.{layer}" for layer in ("train", "eval", "cli", "data"))) == []
    assert _imports_any(checkpoints, ("fsframework.parallel",)) == ["fsframework/checkpoints/writing.py: "
                                                                    "fsframework.parallel.process_group",
                                                                    "fsframework/checkpoints/writing.py: "
                                                                    "fsframework.parallel.process_group.barrier",
                                                                    "fsframework/checkpoints/writing.py: "
                                                                    "fsframework.parallel.process_group.max_over_ranks"]
    assert _imports_any(sorted((pkg / "eval").glob("*.py")), ("fsframework.train", "fsframework.cli")) == []


def test_the_command_line_starts_without_torch_or_numpy():
    # the commands import what needs torch (models, training) or numpy (shards) when they run, so
    # `fsf --help`, a usage error or a bad job file answers without loading them (a fresh interpreter:
    # this one has imported both already)
    probe = "import sys, fsframework.cli; print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'numpy'}))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout


def test_yaml_errors_are_one_line_naming_file_line_and_column(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  name: tfpp\n   d_model: 3\n")
    res = runner.invoke(app, ["config", str(bad)])
    assert res.exit_code == EXIT_BAD_INPUT and "Traceback" not in res.output
    assert res.output.strip().splitlines() == [f"error: {bad}:3:11: invalid YAML: mapping values are not allowed "
                                               "in this context"]
    listing = tmp_path / "list.yaml"
    listing.write_text("- model\n- data\n")
    res = runner.invoke(app, ["config", str(listing)])
    assert res.exit_code == EXIT_BAD_INPUT and "must hold a mapping of keys, not list" in res.output


def test_version_flags_examples_and_task_names_in_the_help():
    from fsframework import __version__
    from fsframework.cli.common import TASK_NAMES
    from fsframework.eval.ruler import SUITE
    from fsframework.eval.suite import TASKS

    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"fsframework {__version__}"
    commands = [["train"], ["eval"], ["run"], ["export"], ["convert"], ["import"], ["generate"], ["info"], ["config"], ["launch"], ["calibrate"],
                ["data", "build"], ["data", "inspect"], ["data", "tokenizer"]]
    for command in commands:
        res = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
        assert res.exit_code == 0 and f"Example: fsf {' '.join(command)}" in res.output, command
    launch_help = runner.invoke(app, ["launch", "--help"], env={"COLUMNS": "200"}).output
    for name in ("--slurm", "--dry-run", "--rdzv"):  # flags take no value
        assert line_of(launch_help, name).split(name)[1].split()[0] != "<bool>", name
    assert TASK_NAMES == (SUITE, *TASKS)
    eval_help = runner.invoke(app, ["eval", "--help"], env={"COLUMNS": "200"}).output
    start = eval_help.index("comma-separated task names:")
    tasks_help = eval_help[start:eval_help.index("--lengths", start)]
    assert all(re.search(rf"\b{name}\b", tasks_help) for name in TASK_NAMES)


def _command_paths(command, path=()):
    """Every command of the `fsf` tree, groups included, as its words after `fsf`."""
    yield list(path)
    for name, sub in getattr(command, "commands", {}).items():
        yield from _command_paths(sub, (*path, name))


def test_no_help_shows_a_type_after_a_flag():
    """typer prints a boolean flag's type, `<bool>`, where an option's value goes (`--help <bool>`);
    a flag takes no value, and no command's help shows one."""
    import typer

    paths = list(_command_paths(typer.main.get_command(app)))
    assert ["data", "build"] in paths and ["generate"] in paths and len(paths) > 15
    for path in paths:
        res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert res.exit_code == 0 and "--help" in res.output, path
        assert "<bool>" not in res.output, (path, res.output)


def line_of(text: str, needle: str) -> str:
    return next(line for line in text.splitlines() if needle in line)


def test_option_errors_name_the_option(tmp_path):
    res = runner.invoke(app, ["eval", str(tmp_path), "--lengths", "abc"])
    assert res.exit_code == EXIT_BAD_INPUT and "--lengths item 'abc'" in res.output
    res = runner.invoke(app, ["eval", str(tmp_path), "--tasks", "perplexity,nope"])
    assert res.exit_code == EXIT_BAD_INPUT and "--tasks 'perplexity,nope': unknown nope; choose from" in res.output
    res = runner.invoke(app, ["eval", str(tmp_path), "--num-samples", "many"])
    assert res.exit_code == EXIT_BAD_INPUT and "--num-samples" in res.output


def test_without_a_gpu_the_triton_status_says_so(monkeypatch):
    import torch

    from fsframework.cli import info

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert info.triton_status().startswith("no GPU")


@pytest.mark.parametrize("command", [[], ["data"]], ids=["fsf", "fsf-data"])
def test_help_lists_each_command_on_one_unbroken_line(command):
    """A command's description wraps at the terminal's width, not where its docstring's lines end:
    on a 200-column terminal every description (all under 150 characters) fits on its one line."""
    res = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200", "TERM": "dumb"})
    panel = res.output.split("Commands")[1].splitlines()[1:-1]
    names = [line.split()[1] for line in panel if len(line.split()) > 1 and line[2] != " "]
    continued = [line for line in panel if line[2] == " " and line.strip("│ ")]
    assert names and not continued, res.output


def test_fsf_config_prints_the_figures_a_job_adds_up_to(monkeypatch):
    import yaml

    from fsframework.config import load_config, to_yaml
    from fsframework.models.registry import build_model, count_parameters

    job = str(Path(__file__).resolve().parents[1] / "yamls" / "quickstart.yaml")
    monkeypatch.setenv("WORLD_SIZE", "8")
    res = CliRunner().invoke(app, ["config", job, "parallel.sp=2", "parallel.grad_accum=3", "train.max_steps=10"])
    assert res.exit_code == 0, res.output
    cfg = load_config(job, ["parallel.sp=2", "parallel.grad_accum=3", "train.max_steps=10"])
    assert yaml.safe_load(res.output) == yaml.safe_load(to_yaml(cfg))  # the figures are comments
    comments = [line for line in res.output.splitlines() if line.startswith("# ")]
    assert comments[0].startswith("# world size 8 (4 data-parallel x 2 sequence-parallel;")
    assert comments[1].startswith("# global batch 96 sequences = 49,152 tokens a step (8 a rank x 3 accumulated x 4")
    assert comments[2] == f"# parameters {count_parameters(build_model(cfg.model)):,}"
    assert comments[3] == "# 10 steps, 491,520 tokens in all"


@pytest.mark.parametrize("tasks, with_data, says", [
    ("[ruler,niah_single_9]", False, "eval.tasks: unknown niah_single_9"),
    ("[qa_1]", False, "put dev-v2.0.json in a folder and pass --ruler-data"),
    ("[ruler]", True, "dev-v2.0.json does not exist"),  # the suite with a QA folder that lacks the files
])
def test_fsf_run_checks_its_eval_tasks_before_training(tmp_path, tasks, with_data, says):
    """A typo in eval.tasks, or a QA task without its file, is one line before any training (no run
    directory made), not an error after hours of it."""
    run_dir = tmp_path / "run"
    data = [f"eval.ruler_data={tmp_path}"] if with_data else []
    res = runner.invoke(app, ["run", "yamls/quickstart.yaml", f"run_dir={run_dir}", f"eval.tasks={tasks}", *data],
                        env={"COLUMNS": "300"})
    assert res.exit_code == 2 and says in res.output and res.output.strip().count("\n") == 0, res.output
    assert not run_dir.exists()
