"""Which implementation an op runs: the PyTorch reference or a Triton kernel of `fsf_kernels`.

Every op with an `impl` argument asks `kernel_for` and runs the reference when
it answers None:

    "reference"  always the reference;
    "triton"     the kernel, or RuntimeError naming why it cannot be imported;
    "auto"       the kernel on CUDA tensors when it imports, the reference
                 elsewhere; a kernel that fails to import on CUDA is reported
                 once (a RuntimeWarning naming the reason), never silently.

The kernels are imported on first use, so the references run without Triton.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Callable

import torch

IMPLS = ("auto", "reference", "triton")

_warned: set[str] = set()  # kernels whose failed import "auto" has already reported


def check_impl(impl: str) -> None:
    """Raise ValueError unless `impl` is one of `IMPLS`."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


def kernel_for(module: str, name: str, impl: str, tensor: torch.Tensor) -> Callable | None:
    """The Triton function `fsf_kernels.<module>.<name>` for `impl`, or None to run the reference.

    tensor: an input of the op; "auto" picks the kernel only when it is on CUDA.
    """
    check_impl(impl)
    if impl == "reference" or (impl == "auto" and not tensor.is_cuda):
        return None
    target = f"fsf_kernels.{module}.{name}"
    try:
        return getattr(importlib.import_module(f"fsf_kernels.{module}"), name)
    except (ImportError, AttributeError) as exc:
        reason = f"{type(exc).__name__}: {exc}"
        if impl == "triton":
            raise RuntimeError(f"impl='triton' requested but {target} is unavailable ({reason}); "
                               "use impl='reference' or 'auto'") from exc
        if target not in _warned:
            _warned.add(target)
            warnings.warn(f"impl='auto': {target} is unavailable ({reason}); running the PyTorch reference "
                          "instead (reported once)", RuntimeWarning, stacklevel=3)
        return None
