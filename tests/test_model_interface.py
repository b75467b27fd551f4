"""Every model is a `LanguageModel`, and the code above the models uses that interface only
(docs/architecture.md, "The model tier"): no attribute probes on models in `train/` and
`parallel/` (at most 3 in the whole library), and no class built or swapped at run time."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from fsframework.config import ModelConfig
from fsframework.models.argrc import ARGRCLanguageModel
from fsframework.models.language_model import LanguageModel
from fsframework.models.registry import MODEL_NAMES, build_model
from fsframework.models.transformer import TransformerLM

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "fsframework"
# an argument that names a model or one of its parts
MODEL_LIKE = re.compile(r"\b(model|module|layer|block|attn|engine)s?\b")
MOST_PROBES_IN_THE_LIBRARY = 3


def object_path(node: ast.expr) -> str:
    """The names an object is reached by (`self.model.layers[0]` -> "self.model.layers"); "" for the
    result of a call (`importlib.import_module(module)` is a Python module, not a model's)."""
    if isinstance(node, ast.Subscript):
        return object_path(node.value)
    if isinstance(node, ast.Attribute):
        base = object_path(node.value)
        return f"{base}.{node.attr}" if base else ""
    return node.id if isinstance(node, ast.Name) else ""


def model_probes(source: str) -> list[tuple[int, str]]:
    """(line, call) of every `hasattr`/`getattr` whose object is a model or a part of one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr")
                and node.args and MODEL_LIKE.search(object_path(node.args[0]))):
            found.append((node.lineno, ast.unparse(node)))
    return found


def class_swaps(source: str) -> list[tuple[int, str]]:
    """(line, code) of every assignment to `__class__` and every three-argument `type(...)`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        if any(isinstance(t, ast.Attribute) and t.attr == "__class__" for t in targets):
            found.append((node.lineno, ast.unparse(node)))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type" \
                and len(node.args) == 3:
            found.append((node.lineno, ast.unparse(node)))
    return found


def scan(files, find) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line}: {code}" for path in files for line, code in find(path.read_text())]


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_kind_builds_a_language_model(name):
    model = build_model(ModelConfig(name=name, vocab_size=32, d_model=16, n_layers=1, n_heads=2))
    assert isinstance(model, LanguageModel)
    assert issubclass(TransformerLM, LanguageModel) and issubclass(ARGRCLanguageModel, LanguageModel)


def test_train_and_parallel_do_not_probe_models():
    files = sorted((LIBRARY / "train").rglob("*.py")) + sorted((LIBRARY / "parallel").rglob("*.py"))
    probes = scan(files, model_probes)
    assert not probes, "ask the model through LanguageModel, not by probing it:\n" + "\n".join(probes)


def test_the_library_probes_models_at_most_three_times():
    probes = scan(sorted(LIBRARY.rglob("*.py")), model_probes)
    assert len(probes) <= MOST_PROBES_IN_THE_LIBRARY, "\n".join(probes)


def test_no_class_is_swapped_or_built_at_run_time():
    swaps = scan(sorted(LIBRARY.rglob("*.py")), class_swaps)
    assert not swaps, "set a setting on the module instead of changing its class:\n" + "\n".join(swaps)


def test_the_scans_find_what_they_look_for():
    # what a careless change would add: a probe on a model, a class swap, a class built by type()
    source = ("def f(model, x):\n"
              "    if hasattr(model, 'layers'):\n"
              "        blocks = getattr(model.layers[0], 'attn', None)\n"
              "    model.__class__ = type('Wrapped', (Mixin, type(model)), {})\n"
              "    getattr(importlib.import_module(module), 'name')\n"
              "    return getattr(self.engine.module, 'step') or getattr(x, 'shape')\n")
    assert [line for line, _ in model_probes(source)] == [2, 3, 6]
    assert [line for line, _ in class_swaps(source)] == [4, 4]
