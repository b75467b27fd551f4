"""`fsf info`: what this machine offers the framework."""

from __future__ import annotations

import importlib
import os
import platform


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
        return kernel_launch_check()
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "no GPU; interpreter on CPU (slow: for tests)"
    return "no GPU (the interpreter runs them on CPU with TRITON_INTERPRET=1; models use reference ops)"


def kernel_launch_check(device: str = "cuda") -> str:
    """Compile and launch one tiny kernel (window attention, bf16, forward and backward) and compare
    it with the reference: a toolchain that cannot build or run kernels shows here, not mid-run."""
    import time

    import torch

    from fsframework.ops.local_attention import sliding_window_attention

    if torch.device(device).type == "cuda":
        if not torch.cuda.is_available():
            return "NO: no CUDA device is visible to torch"
        from fsf_kernels.common.support import SHARED_LIMIT, device_target, device_unsupported

        refused = device_unsupported(torch.device(device))
        if refused:
            return f"NO: the kernels do not run on {refused}; models use reference ops"
        major, minor = torch.cuda.get_device_capability(device)
        target = device_target(torch.device(device))
        name = (f"CUDA {torch.cuda.get_device_name(device)}, sm_{major}{minor}, the sm_{target} tiles "
                f"({SHARED_LIMIT[target]:,} B of shared memory per block)")
        sync = torch.cuda.synchronize
    else:  # the interpreter (TRITON_INTERPRET=1): how the tests exercise this check
        name, sync = "the CPU interpreter", lambda device: None
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 96, 2, 64, generator=gen).to(device, torch.bfloat16).requires_grad_() for _ in range(3))
    t0 = time.perf_counter()
    try:
        out = sliding_window_attention(q, k, v, window=32, impl="triton")
        out.float().square().sum().backward()
        sync(device)
    except Exception as exc:  # the point is to report it
        return f"NO: the window-attention kernel failed on {name}: {type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - t0
    want = sliding_window_attention(*(x.detach().float() for x in (q, k, v)), window=32, impl="reference")
    err = (out.float() - want).abs().max().item()
    verdict = "yes" if err < 5e-2 and torch.isfinite(q.grad).all() else "WRONG RESULT"
    return (f"{verdict} ({name}: window attention compiled and ran forward and backward in {seconds:.1f} s, "
            f"max error vs the reference {err:.1e})")


def collect_info() -> dict[str, str]:
    from fsframework.parallel.process_group import setup_environment

    setup_environment()
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
