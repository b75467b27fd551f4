"""`fsf info`: what this machine offers the framework."""

from __future__ import annotations

import importlib
import os
import platform

from fsframework.cli.common import runtime


def _version(module: str) -> str:
    try:
        return getattr(importlib.import_module(module), "__version__", "installed")
    except Exception as exc:  # a broken install is worth reporting, not crashing on
        return f"unavailable ({type(exc).__name__})"


def triton_status() -> str:
    """Whether the Triton kernels can run here: on a GPU (checked by compiling and launching one),
    under the interpreter, or not at all."""
    import torch

    try:
        import triton  # noqa: F401
    except ImportError:
        return "no (triton not installed; reference ops are used)"
    if torch.cuda.is_available():
        return runtime().launch_check.kernel_launch_check()
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "no GPU; interpreter on CPU (slow: for tests)"
    return "no GPU (the interpreter runs them on CPU with TRITON_INTERPRET=1; models use reference ops)"


def collect_info() -> dict[str, str]:
    runtime().process_group.setup_environment()
    import torch

    devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    info = {"python": platform.python_version(), "platform": platform.platform()}
    for name, module in (("fsframework", "fsframework"), ("torch", "torch"), ("triton", "triton"),
                         ("deepspeed", "deepspeed"), ("mosaicml-streaming", "streaming"), ("omegaconf", "omegaconf")):
        info[name] = _version(module)
    info["cpu threads"] = str(torch.get_num_threads())
    info["devices"] = ", ".join(devices) if devices else "cpu only"
    info["triton kernels"] = triton_status()
    return info


def print_info(info: dict[str, str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="fsframework environment", show_header=False)
    for key, value in info.items():
        table.add_row(key, value)
    Console().print(table)


def info() -> None:
    """Versions of the engines, devices, and whether Triton kernels can run.

    Example: fsf info
    """
    print_info(collect_info())
