"""Imports point down the layers (docs/architecture.md), function-level imports included.

    fsf_kernels < ops < config < models < data, parallel < checkpoints < export < eval < train < cli

`data` and `parallel` are peers and import neither each other. No import goes up: `config`
validates `model.name` against its own table of kind facts (`fsframework.config.kinds`), which
the model registry reads. Library code imports nothing of `experiments/`, and the user tools in
`tools/` import no private names.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS = {
    "fsf_kernels": 0,
    "fsframework.ops": 1,
    "fsframework.quiet": 1.5,  # the libraries' warning filters: config declares the log levels, every layer may use it
    "fsframework.config": 2,
    "fsframework.models": 3,
    "fsframework.data": 4,
    "fsframework.parallel": 4,
    "fsframework.checkpoints": 5,
    "fsframework.export": 5.5,  # reads checkpoints, writes export directories; eval, train and cli use it
    "fsframework.eval": 6,
    "fsframework.train": 7,
    "fsframework.cli": 8,
    "fsframework.launcher": 8,
    "fsframework.info": 8,
    "fsframework.__main__": 8,
    "fsframework": 8,  # the package's own __init__
}
PEERS = {"fsframework.data", "fsframework.parallel"}
ALLOWED_UPWARD: set[tuple[str, str]] = set()  # (importer layer, imported module) pairs allowed to go up


def layer_of(module: str) -> str | None:
    """The longest LAYERS key that `module` is or lies inside."""
    best = None
    for key in LAYERS:
        if (module == key or module.startswith(key + ".")) and (best is None or len(key) > len(best)):
            best = key
    return best


def module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root / "kernels" if path.is_relative_to(root / "kernels") else root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            # `from fsframework import eval` imports a subpackage: each name may be a module
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def library_files() -> list[Path]:
    return sorted((ROOT / "fsframework").rglob("*.py")) + sorted((ROOT / "kernels" / "fsf_kernels").rglob("*.py"))


def upward_imports(files: list[Path] | None = None, root: Path = ROOT) -> list[str]:
    """The upward imports of `files` (default: the library's) under the checkout `root`."""
    problems = []
    for path in library_files() if files is None else files:
        me = module_name(path, root)
        mine = layer_of(me)
        assert mine is not None, f"{me} belongs to no layer: add it to LAYERS in {Path(__file__).name}"
        for line, target in imports(path, root):
            theirs = layer_of(target)
            where = f"{path.relative_to(root)}:{line} ({me} -> {target})"
            if target.split(".")[0] == "experiments":
                problems.append(f"{where}: library code imports experiments")
            if theirs is None or theirs == mine:
                continue
            if mine == "fsf_kernels":
                problems.append(f"{where}: the kernels import torch and triton only")
            elif any(mine == a and (target == b or target.startswith(b + ".")) for a, b in ALLOWED_UPWARD):
                continue
            elif LAYERS[theirs] > LAYERS[mine] or {mine, theirs} == PEERS:
                problems.append(f"{where}: {mine} may not import {theirs}")
    return problems


def test_imports_point_down():
    problems = upward_imports()
    assert not problems, "upward imports:\n" + "\n".join(problems)


def test_the_scan_sees_function_level_and_relative_imports(tmp_path):
    # the scan must catch what a careless change would add: an import inside a function
    # (a probe module in a copy of the layout under tmp_path: nothing is written into the package)
    source = "def f():\n    from fsframework.train import trainer\n    from . import losses\n"
    path = tmp_path / "fsframework" / "models" / "_layering_probe.py"
    path.parent.mkdir(parents=True)
    path.write_text(source)
    found = dict((m, line) for line, m in imports(path, tmp_path))
    assert "fsframework.train" in found and "fsframework.models.losses" in found
    problems = upward_imports([path], tmp_path)
    assert any("_layering_probe.py:2" in p and "may not import fsframework.train" in p for p in problems)


# imports of the project's own modules inside functions: each one says why (a cycle, an optional
# dependency, a start-up cost) in a comment on its line or the line above; a few, not a habit
MOST_FUNCTION_LEVEL_IMPORTS = 15


def function_level_imports(files: list[Path], root: Path = ROOT) -> list[tuple[str, bool]]:
    """(place, has a reason comment) of each project import nested in a function of `files`."""
    found = []
    for path in files:
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines), filename=str(path))
        seen: set[int] = set()
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if id(node) in seen or not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or "."]
                if node.__class__ is ast.ImportFrom and node.level or any(
                        n.split(".")[0] in ("fsframework", "fsf_kernels") for n in names):
                    seen.add(id(node))
                    above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
                    reason = "#" in lines[node.end_lineno - 1] or above.startswith("#")
                    found.append((f"{path.relative_to(root)}:{node.lineno}", reason))
    return found


def test_project_imports_sit_at_module_level_unless_a_comment_says_why():
    found = function_level_imports(sorted((ROOT / "fsframework").rglob("*.py")))
    unexplained = [place for place, reason in found if not reason]
    assert not unexplained, "imports inside functions without a comment saying why:\n" + "\n".join(unexplained)
    assert len(found) <= MOST_FUNCTION_LEVEL_IMPORTS, (
        f"{len(found)} project imports inside functions (at most {MOST_FUNCTION_LEVEL_IMPORTS}): "
        + ", ".join(place for place, _ in found))


def test_the_function_level_scan_finds_an_unexplained_import(tmp_path):
    path = tmp_path / "fsframework" / "probe.py"
    path.parent.mkdir(parents=True)
    path.write_text("def f():\n    from fsframework.models import registry\n\n\n"
                    "def g():\n    # torch: not at start-up\n    from fsframework.train import trainer\n\n\n"
                    "def h():\n    import json\n")
    assert function_level_imports([path], tmp_path) == [("fsframework/probe.py:2", False),
                                                         ("fsframework/probe.py:7", True)]


def test_tools_use_public_names_only():
    problems = []
    for path in sorted((ROOT / "tools").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fsframework"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                if private or any(part.startswith("_") for part in node.module.split(".")):
                    problems.append(f"{path.name}:{node.lineno} imports {node.module}: {private}")
    assert not problems, "tools import private names:\n" + "\n".join(problems)
