"""Which implementation an op runs: PyTorch or a Triton kernel of `fsf_kernels`.

Every op with an `impl` argument asks `kernel_for` and runs PyTorch when it
answers None: its reference, or, under "auto", the fused PyTorch form an op may
have beside it (the sliding window's `window_attention_sdpa`, tested against
the reference; the reference stays what the kernels are judged by):

    "reference"  always the reference;
    "triton"     the kernel; RuntimeError naming why it cannot be imported, or
                 ValueError naming what of the call it does not support;
    "auto"       the kernel on CUDA tensors when it imports and supports the call
                 (dtype, head dim, K, P, the device's shared memory:
                 `fsf_kernels.common.support`), PyTorch
                 elsewhere. A kernel that fails to import on CUDA, or
                 a call it cannot run, is reported once (a RuntimeWarning naming
                 the reason), never silently.

The kernels are imported on first use, so the references run without Triton.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Callable

import torch

from fsf_kernels.common.support import device_unsupported  # torch only: loads no Triton
from fsframework.ops.impls import IMPLS, check_impl  # noqa: F401 (IMPLS re-exported: ops import it from here)

_warned: set[str] = set()  # what "auto" has already reported: failed imports and refused calls


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message + " (reported once)", RuntimeWarning, stacklevel=4)


def kernel_for(module: str, name: str, impl: str, tensor: torch.Tensor,
               unsupported: str | None = None) -> Callable | None:
    """The Triton function `fsf_kernels.<module>.<name>` for `impl`, or None to run the reference.

    tensor: an input of the op; "auto" picks the kernel only when it is on CUDA.
    unsupported: why the kernel cannot run this call (from `fsf_kernels.common.support`), or
    None when it can.
    """
    check_impl(impl)
    if impl == "reference" or (impl == "auto" and not tensor.is_cuda):
        return None
    target = f"fsf_kernels.{module}.{name}"
    if unsupported is None and tensor.is_cuda:
        unsupported = device_unsupported(tensor.device)
    if unsupported is not None:
        if impl == "triton":
            raise ValueError(f"impl='triton': {target} does not support {unsupported}; use impl='reference' or "
                             "'auto' (which runs the reference for it)")
        _warn_once(f"{target}: {unsupported}", f"impl='auto': {target} does not support {unsupported}; running "
                   "PyTorch (the reference or the op's fused form) for such calls")
        return None
    try:
        return getattr(importlib.import_module(f"fsf_kernels.{module}"), name)
    except Exception as exc:  # ImportError, a missing name, or a Triton install that fails at import

        reason = f"{type(exc).__name__}: {exc}"
        if impl == "triton":
            raise RuntimeError(f"impl='triton' requested but {target} is unavailable ({reason}); "
                               "use impl='reference' or 'auto'") from exc
        _warn_once(target, f"impl='auto': {target} is unavailable ({reason}); running PyTorch (the "
                   "reference or the op's fused form) instead")
        return None
