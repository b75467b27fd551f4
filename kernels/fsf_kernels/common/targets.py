"""GPU targets without a GPU: compile a kernel launch for sm_80 / sm_86 / sm_90 and read its shared memory.

Triton compiles for a CUDA target on any machine with its bundled ptxas; the result's
`metadata.shared` is the shared memory one program needs, which must fit the target's
per-block limit or the launch fails on the device. Each kernel module describes the
launches its launcher really makes (`launches(...)`, built from the same tile choice
as the launch itself), so the compile test (tests/kernels/test_compile_targets.py) and
`python -m fsf_kernels.compile_check` check exactly what a GPU will run.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

import torch
import triton

from fsf_kernels.common.support import SHARED_LIMIT  # one table for the launches' tiles and the checks

TARGETS = tuple(sorted(SHARED_LIMIT))

_PTR = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16"}


def ptr(dtype: torch.dtype) -> str:
    return _PTR[dtype]


@dataclass(frozen=True)
class Launch:
    """One compiled variant of a kernel: its constexprs and launch options, and the type of each
    pointer argument (every other runtime argument is i32, or fp32 when named in `floats`)."""

    label: str
    fn: object
    pointers: tuple  # ((name, "*bf16"), ...)
    constexprs: tuple  # ((name, value), ...)
    floats: frozenset = frozenset()
    num_warps: int = 4
    num_stages: int = 3
    extra: tuple = field(default=())  # (name, "i64") for runtime args of another type

    def key(self) -> tuple:
        return (self.fn.__name__, self.pointers, tuple((k, str(v)) for k, v in self.constexprs), self.floats,
                self.num_warps, self.num_stages, self.extra)


def launch(label: str, fn, pointers: dict, constexprs: dict, *, floats=(), num_warps: int = 4, num_stages: int = 3,
           extra: dict | None = None) -> Launch:
    return Launch(label, fn, tuple(pointers.items()), tuple(constexprs.items()), frozenset(floats), num_warps,
                  num_stages, tuple((extra or {}).items()))


@dataclass(frozen=True)
class Compiled:
    label: str
    arch: int
    shared: int
    seconds: float

    @property
    def limit(self) -> int:
        return SHARED_LIMIT[self.arch]

    @property
    def fits(self) -> bool:
        return self.shared <= self.limit


def _source(item: Launch):
    from triton.compiler import ASTSource

    fn = getattr(item.fn, "fn", item.fn)  # an autotuned or heuristics wrapper holds the jit function
    jit = item.fn
    pointers, consts, extra = dict(item.pointers), dict(item.constexprs), dict(item.extra)
    signature, attrs = {}, {}
    for i, name in enumerate(jit.arg_names):
        if name in consts:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = pointers[name]
            attrs[(i,)] = [["tt.divisibility", 16]]  # torch allocations are 16-byte aligned
        elif name in extra:
            signature[name] = extra[name]
        elif name in item.floats:
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            # strides and sizes that are multiples of 16 let Triton vectorise (and pipeline) loads:
            # the most demanding specialisation a real launch can get
            attrs[(i,)] = [["tt.divisibility", 16]]
    missing = set(consts) - set(jit.arg_names)
    if missing:
        raise ValueError(f"{fn.__name__}: no constexpr argument named {sorted(missing)}")
    return ASTSource(jit, signature, consts, attrs)


@functools.lru_cache(maxsize=None)
def _compile(key: tuple, arch: int, item: Launch) -> Compiled:
    from triton.backends.compiler import GPUTarget

    t0 = time.perf_counter()
    compiled = triton.compile(_source(item), target=GPUTarget("cuda", arch, 32),
                              options=dict(num_warps=item.num_warps, num_stages=item.num_stages))
    return Compiled(item.label, arch, int(compiled.metadata.shared), time.perf_counter() - t0)


def compile_for(item: Launch, arch: int) -> Compiled:
    """Compile `item` for sm_`arch` (cached for the process: launches shared by several
    configurations compile once)."""
    return _compile(item.key(), arch, item)

