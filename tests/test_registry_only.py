"""The registry is the one place that knows a kind: no module outside `fsframework/models/registry.py`
compares a model name with a registered kind's name. What differs between kinds is a field of
the kind's entry (routing variant, calibration, read settings, native export), read where it
matters; a switch on names elsewhere would have to be found and edited for every new kind."""

from __future__ import annotations

import ast
from pathlib import Path

from fsframework.models.registry import KINDS, attention_kind

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "fsframework" / "models" / "registry.py"
NAME_HOLDERS = {"name", "model_name", "kind_name", "kind"}  # `cfg.model.name`, `name`, `self.model_name`, ...


def _names_a_model(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in NAME_HOLDERS) or \
        (isinstance(node, ast.Name) and node.id in NAME_HOLDERS)


def _kind_literals(node: ast.AST) -> set[str]:
    """The registered kind names `node` spells out as a string or a tuple/list/set of strings."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str) and i.value in KINDS}


def name_switches(source: str, filename: str) -> list[str]:
    """`file:line` of every comparison of a model name with registered kind names in `source`."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        if any(_names_a_model(o) for o in operands) and any(_kind_literals(o) for o in operands):
            found.append(f"{filename}:{node.lineno}")
    return found


def test_no_module_outside_the_registry_switches_on_kind_names():
    found = []
    for path in sorted((ROOT / "fsframework").rglob("*.py")):
        if path != REGISTRY:
            found += name_switches(path.read_text(), str(path.relative_to(ROOT)))
    assert not found, f"switches on model names outside models/registry.py (make it a registry field): {found}"


def test_the_scan_finds_the_forms_a_switch_takes():
    # the scan must not pass vacuously: each of these is a switch it has to report
    for code in ('if cfg.model.name == "tfpp": pass', 'if self.cfg.name != "fsb": pass',
                 'x = name in ("fs", "fsl")', 'y = kind == "tfpp"', 'ok = "argrc" == model.name'):
        assert name_switches(code, "probe.py") == ["probe.py:1"], code
    # comparisons that are not about kinds stay quiet
    for code in ('if path.name == "checkpoints": pass', 'if variant == "fs": pass', 'if cfg.name == other: pass'):
        assert name_switches(code, "probe.py") == [], code


def test_each_kind_entry_answers_what_used_to_be_switched_on():
    assert attention_kind("tfpp").native_adapter().to_native_name("embed.weight") == "model.embed_tokens.weight"
    assert all(attention_kind(k).native_export is None for k in KINDS if k != "tfpp")
    assert {k: KINDS[k].routing for k in KINDS if KINDS[k].freesolo} == {"fs": "fs", "fsl": "fsl", "fsb": "fsb"}
    assert [k for k in KINDS if KINDS[k].calibrated] == ["fsb"]
    from fsframework.config import AttentionConfig

    a = AttentionConfig()
    assert attention_kind("fsb").read_path(a) == {"model": "fsb", "top_k": a.fsb.top_k, "beam_width": a.fsb.beam_width,
                                                  "bound_c": a.fsb.bound_c, "forests": a.fsb.forests}
    assert attention_kind("fsl").read_path(a) == {"model": "fsl", "top_k": a.top_k}
    assert attention_kind("swa").read_path(a) == {"model": "swa"}
