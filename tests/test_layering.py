"""Imports point down the layers: `data` imports no eval, train or CLI code (the prompt
templates, text sources and synthetic batches it shares with eval live in `data`), and the
library never imports the research code under `experiments/`. Every import counts,
function-level ones too."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.utils import REPO


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, at any depth; `package` is the
    package the source belongs to (relative imports resolve against it)."""
    parts = package.split(".")
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(parts[:len(parts) - node.level + 1]) if node.level else ""
            module = ".".join(filter(None, [base, node.module or ""]))
            out.append((node.lineno, module))
            # `from fsframework import eval` imports a module too
            out += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return out


def layer(module: str) -> str | None:
    """The layer of a module: `experiments`, or the subpackage of fsframework (`cli` for every
    CLI module); None for anything else."""
    parts = module.split(".")
    if parts[0] == "experiments":
        return "experiments"
    if parts[0] != "fsframework" or len(parts) < 2:
        return None
    return "cli" if parts[1].startswith("cli") else parts[1]


def violations(folder: str, forbidden: set[str]) -> list[str]:
    found = []
    for path in sorted((REPO / folder).rglob("*.py")):
        rel = path.relative_to(REPO).with_suffix("").parts
        package = ".".join(rel if rel[-1] == "__init__" else rel[:-1]).removesuffix(".__init__")
        for line, module in imported_modules(path.read_text(), package):
            if layer(module) in forbidden:
                found.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    return found


def test_data_imports_no_eval_train_or_cli():
    assert violations("fsframework/data", {"eval", "train", "cli"}) == []


def test_the_library_does_not_import_experiments():
    assert violations("fsframework", {"experiments"}) == []


def test_the_scan_sees_function_level_and_relative_imports():
    source = "import os\n\ndef f():\n    from ..eval import suite\n    from . import shards\n    import fsframework.cli_data\n"
    modules = {m for _, m in imported_modules(source, "fsframework.data")}
    assert {"fsframework.eval", "fsframework.eval.suite", "fsframework.data.shards"} <= modules
    assert {layer(m) for m in modules} == {None, "eval", "data", "cli"}
