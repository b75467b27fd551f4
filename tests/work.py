"""Counting work, not time (tests/ops/test_work_counts.py, tests/models/test_decode_work.py).

`WorkCounter` is a `__torch_dispatch__` mode that sums the multiply-adds of every matrix
product and attention call that runs under it (a fused attention's backward too), the elements
every op writes (the elementwise, indexing and reduction work a multiply-add count misses: a pass
over every cell of the context shows there), notes the largest tensor produced, and counts the
aten ops dispatched, by name (a decoded token's host work).
`torch.utils.flop_counter.FlopCounterMode` is no use here: it does not count the CPU's
fused SDPA (`aten._scaled_dot_product_flash_attention_for_cpu`), which is where the
attention of the prefix kinds runs. Counts are exact and machine-independent, so a
complexity guard can compare them across sizes without timing noise. Count under
`torch.no_grad()`: ops under `torch.inference_mode()` bypass Python dispatch modes (nothing
would be counted).
"""

from __future__ import annotations

import collections
import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# fused attention entries: q [B, H, L, E], k [B, H, S, E], v [B, H, S, Ev]
_SDPA = {
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
}
# their backward entries (same q, k, v arguments): the scores recomputed from the saved
# log-sum-exp (S = Q K^T) and the gradient's four products (dV = P^T dO, dP = dO V^T, dQ = dS K,
# dK = dS^T Q): five products of the forward's two
_SDPA_BACKWARD = {
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    aten._scaled_dot_product_flash_attention_backward.default,
    aten._scaled_dot_product_efficient_attention_backward.default,
    aten._scaled_dot_product_cudnn_attention_backward.default,
}


def _bind(func, args, kwargs) -> dict:
    """The op's arguments by schema name."""
    names = [a.name for a in func._schema.arguments]
    return {**dict(zip(names, args)), **kwargs}


def multiply_adds(func, args, kwargs) -> int:
    """Multiply-adds of one aten call (0 for anything that is not a product or attention)."""
    packet = func.overloadpacket
    if packet in (aten.mm, aten.addmm):
        a, b = args[-2], args[-1]
        return a.shape[0] * a.shape[1] * b.shape[1]
    if packet in (aten.bmm, aten.baddbmm):
        a, b = args[-2], args[-1]
        return a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
    if packet in (aten.mv, aten.addmv):
        a = args[-2]
        return a.shape[0] * a.shape[1]
    if packet is aten.dot:
        return args[0].numel()
    if func in _SDPA or func in _SDPA_BACKWARD:
        bound = _bind(func, args, kwargs)
        q, k, v = bound["query"], bound["key"], bound["value"]
        work = math.prod(q.shape[:-1]) * k.shape[-2] * (q.shape[-1] + v.shape[-1])
        # a fused causal call skips the tiles above the diagonal: count half its square
        work = work // 2 if bound.get("is_causal", False) else work
        return work * 5 // 2 if func in _SDPA_BACKWARD else work
    return 0


# in-place writes at indices: the argument whose elements are written (the rest of `self` is untouched)
_INDEXED_WRITES = {
    aten.index_add_: "source", aten.index_copy_: "source", aten.masked_scatter_: "source",
    aten.scatter_: "index", aten.scatter_add_: "index", aten.scatter_reduce_: "index",
}


def elements_written(func, args, kwargs, out) -> int:
    """Elements one aten call writes: none for a view (it aliases its input), the written indices for
    an indexed in-place write, else every element of what it returns (a new tensor, or the whole
    `self` / `out` of an in-place or out= op)."""
    returns = func._schema.returns
    if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
        return 0  # a view
    packet = func.overloadpacket
    if packet is aten.index_put_:
        bound = _bind(func, args, kwargs)
        values, indices = bound["values"], [i for i in bound["indices"] if i is not None]
        picked = torch.broadcast_shapes(*(i.shape for i in indices)).numel() if indices else 1
        return max(values.numel(), picked)
    if packet in _INDEXED_WRITES:
        return _bind(func, args, kwargs)[_INDEXED_WRITES[packet]].numel()
    return sum(t.numel() for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor))


class WorkCounter(TorchDispatchMode):
    """`with WorkCounter() as work: ...` -> `work.macs` (multiply-adds), `work.written` (elements
    written, `elements_written`), `work.largest` (elements of the largest tensor any op produced),
    `work.ops` (aten ops dispatched, a Counter by op name) and `work.dispatched` (their total)."""

    def __init__(self):
        super().__init__()
        self.macs = 0
        self.written = 0
        self.largest = 0
        self.ops: collections.Counter[str] = collections.Counter()

    @property
    def dispatched(self) -> int:
        return sum(self.ops.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops[func.overloadpacket.__name__] += 1
        self.macs += multiply_adds(func, args, kwargs)
        self.written += elements_written(func, args, kwargs, out)
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def count(fn, *args, **kwargs) -> WorkCounter:
    """Run `fn(*args, **kwargs)` under a fresh `WorkCounter` and return it (it counted something)."""
    with WorkCounter() as work:
        fn(*args, **kwargs)
    assert work.macs > 0, "nothing counted (under torch.inference_mode?)"  # a guard must not pass vacuously
    return work
