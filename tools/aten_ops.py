"""Host work of a call, machine-independent: the aten ops it dispatches (each a kernel launch on a GPU;
a Triton kernel's launch is not one), counted with a TorchDispatchMode. Shared by the benchmarks that
print it (bench_documents.py, bench_fsb.py); it needs torch only, as on the GPU check's machine."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class CountOps(TorchDispatchMode):
    """Counts every aten op dispatched while it is active."""

    ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def count_aten_ops(fn, *args, **kwargs) -> int:
    """The aten ops one call `fn(*args, **kwargs)` dispatches. Call it under `torch.no_grad()` for a
    forward: inference mode would hide ops from the mode."""
    with CountOps() as count:
        fn(*args, **kwargs)
    return count.ops
