"""Layering: `fsf_kernels` is a leaf (it imports torch, triton, the stdlib and itself only), and the
references in `fsframework.ops` with the torch-only kernel modules import without Triton."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import fsf_kernels
import fsframework

KERNELS = Path(fsf_kernels.__file__).resolve().parent
ALLOWED = {"torch", "triton", "fsf_kernels"} | set(sys.stdlib_module_names)
# modules that must load without Triton (the references in fsframework.ops use them)
TORCH_ONLY = ("fsf_kernels", "fsf_kernels.common", "fsf_kernels.common.args", "fsf_kernels.common.rope_tables",
              "fsf_kernels.common.support")


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every import anywhere in the tree, function-level ones and
    `importlib.import_module` / `__import__` calls with a literal name included."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            # a relative import stays inside fsf_kernels
            found.append((node.lineno, "fsf_kernels" if node.level else node.module))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__"):
                found.append((node.lineno, node.args[0].value))
    return found


def test_scanner_sees_every_kind_of_import():
    source = textwrap.dedent("""
        import a.b, c
        from d.e import f
        from . import g
        def h():
            import i
            importlib.import_module("j.k")
            __import__("l")
    """)
    assert sorted(m for _, m in imported_modules(ast.parse(source))) == ["a.b", "c", "d.e", "fsf_kernels", "i",
                                                                         "j.k", "l"]

def test_fsf_kernels_imports_only_torch_triton_stdlib_and_itself():
    files = sorted(KERNELS.rglob("*.py"))
    assert files, KERNELS
    bad = []
    for path in files:
        for line, module in imported_modules(ast.parse(path.read_text(), filename=str(path))):
            if module.split(".")[0] not in ALLOWED:
                bad.append(f"{path.relative_to(KERNELS.parent)}:{line}: {module}")
    assert not bad, "fsf_kernels must import only torch, triton, the stdlib and itself:\n" + "\n".join(bad)


def test_references_and_torch_only_kernel_modules_import_without_triton():
    """In a fresh interpreter where `import triton` fails, the references load and run, and
    impl="triton" says why it cannot run."""
    roots = {str(Path(fsframework.__file__).resolve().parents[1]), str(KERNELS.parent)}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*roots, os.environ.get("PYTHONPATH", "")]))
    script = textwrap.dedent(f"""
        import importlib, sys
        sys.modules["triton"] = None  # any `import triton...` now raises ImportError
        import torch
        for name in {TORCH_ONLY!r} + ("fsframework.ops.dispatch", "fsframework.ops.rope",
                                      "fsframework.ops.freesolo_routing", "fsframework.ops.freesolo_readout",
                                      "fsframework.ops.freesolo", "fsframework.ops.local_attention",
                                      "fsframework.ops.rewired"):
            importlib.import_module(name)
        assert sys.modules["triton"] is None
        assert not any(m.startswith("triton.") for m in sys.modules), "a triton submodule was imported"
        from fsframework.models.freesolo_settings import fs_pair
        from fsframework.ops.freesolo import long_range_attention
        from fsframework.ops.local_attention import sliding_window_attention
        x = torch.randn(1, 16, 2, 8)
        assert long_range_attention(x, x, x, *fs_pair(cell_size=4, block_size=8, top_k=2)).shape == x.shape
        assert sliding_window_attention(x, x, x, window=3).shape == x.shape
        try:
            sliding_window_attention(x, x, x, window=3, impl="triton")
        except RuntimeError as exc:
            assert "triton" in str(exc), exc
        else:
            raise AssertionError("impl='triton' without Triton must raise")
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


def test_kernels_and_references_share_one_copy_of_the_checks_and_tables():
    import importlib

    from fsf_kernels.common import args, rope_tables, support
    from fsframework.ops import freesolo, freesolo_routing, local_attention, rope

    # the subpackages export functions named like their modules: fetch the modules themselves
    kernel_readout, kernel_routing, kernel_window = (importlib.import_module(f"fsf_kernels.{name}.{name}") for name in
                                                     ("cell_readout", "cell_routing", "window_attention"))

    for module in (kernel_routing, freesolo_routing):
        assert module.check_routing_args is args.check_routing_args
    # one table of what the kernels accept, read by the kernels and by the dispatching ops
    assert kernel_routing.routing_unsupported is freesolo.routing_unsupported is support.routing_unsupported
    assert kernel_readout.readout_unsupported is freesolo.readout_unsupported is support.readout_unsupported
    assert kernel_window.window_unsupported is local_attention.window_unsupported is support.window_unsupported
    assert kernel_routing.prior_per_head is freesolo_routing.prior_per_head is args.prior_per_head
    assert kernel_readout.check_readout_args is freesolo.check_readout_args is args.check_readout_args
    assert kernel_window.check_window_args is local_attention.check_window_args is args.check_window_args
    assert rope.rope_cos_sin is rope_tables.rope_cos_sin
    assert kernel_window.rope_tables is rope_tables.rope_tables
