"""Kernel tests: Triton runs on the CPU interpreter unless a CUDA device is present.

`triton.jit` reads TRITON_INTERPRET when a kernel is decorated, i.e. when an
fsf_kernels module is imported. pytest imports this file before the test
modules, so the variable is set here; if another test module imported the
kernels first (in compiled mode), say so instead of failing obscurely.
"""

import math
import os
import sys

import pytest
import torch

# torch-only modules (fsframework.ops imports them): loading them decorates no kernel
_TORCH_ONLY = ("fsf_kernels.common", "fsf_kernels.common.args", "fsf_kernels.common.rope_tables",
               "fsf_kernels.common.support", "fsf_kernels.common.tree_tables")

if "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "0" if torch.cuda.is_available() else "1"
    if os.environ["TRITON_INTERPRET"] == "1" and any(m.startswith("fsf_kernels.") and m not in _TORCH_ONLY
                                                     for m in sys.modules):
        raise RuntimeError("fsf_kernels was imported before tests/kernels/conftest.py could set "
                           "TRITON_INTERPRET=1; run pytest with TRITON_INTERPRET=1 in the environment")

# the kernel modules whose fresh torch.empty outputs are poisoned below
_KERNEL_MODULES = (
    "fsf_kernels.common.rope",
    "fsf_kernels.common.softmax_bwd",
    "fsf_kernels.window_attention.window_attention",
    "fsf_kernels.cell_routing.cell_routing",
    "fsf_kernels.cell_readout.cell_readout",
    "fsf_kernels.rewired_attention.rewired_attention",
    "fsf_kernels.grc_scan.cell",
    "fsf_kernels.fsb_search.beam_search",
)


def _poison(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point():
        return t.fill_(math.nan)
    if t.dtype != torch.bool:
        return t.fill_(-12345)
    return t


class _PoisonedTorch:
    """`torch` as the kernel modules see it, except that empty tensors come back full of NaN (or -12345)."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def empty(self, *args, **kwargs):
        return _poison(self._real.empty(*args, **kwargs))

    def empty_like(self, *args, **kwargs):
        return _poison(self._real.empty_like(*args, **kwargs))


@pytest.fixture(autouse=True)
def poison_empty(monkeypatch):
    """A kernel that leaves part of an output unwritten then fails its comparison loudly."""
    import importlib

    for name in _KERNEL_MODULES:
        monkeypatch.setattr(importlib.import_module(name), "torch", _PoisonedTorch(torch))
    yield


@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
