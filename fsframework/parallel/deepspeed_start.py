"""Starting a DeepSpeed engine without compiling what fsframework never runs.

Two things DeepSpeed would build at every engine start that fsframework never calls:
`import_muon_lazily` (below) and `skip_shared_memory_allreduce` (the CPU accelerator's
shared-memory all-reduce extension, further below).

Every ZeRO stage imports DeepSpeed's Muon optimizer (`deepspeed.runtime.zero.muon`) when its
engine starts, to ask whether the run's optimizer is one. That module applies `torch.compile` to
its update functions when imported, and `torch.compile` loads torch's inductor on the spot: about
4.4 s of CPU on every rank of every job, for functions only a Muon optimizer calls (fsframework's
is `SkippableAdamW`). `import_muon_lazily` imports the module first with those functions compiled
on their first call instead: the same functions, compiled when (if ever) they run.
"""

from __future__ import annotations

import functools
import importlib
import sys

MUON_MODULES = ("deepspeed.runtime.zero.muon.original_muon", "deepspeed.runtime.zero.muon.muon_optimizer")


def compiled_on_first_call(fn):
    """`fn`, run through `torch.compile` when first called rather than when decorated."""
    compiled = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal compiled
        if compiled is None:
            import torch

            compiled = torch.compile(fn)
        return compiled(*args, **kwargs)

    return call


def import_muon_lazily() -> None:
    """Import DeepSpeed's Muon modules with their `@compiler.compile()` decorators deferred (a no-op
    where they are imported already: their functions stay as they were compiled)."""
    if all(name in sys.modules for name in MUON_MODULES):
        return
    from deepspeed.runtime import compiler

    eager = compiler.compile
    compiler.compile = lambda: compiled_on_first_call  # what the decorators call, at import only
    try:
        for name in MUON_MODULES:
            importlib.import_module(name)
    finally:
        compiler.compile = eager


SHARED_MEMORY_ALLREDUCE_OP = "deepspeed_shm_comm"


def skip_shared_memory_allreduce() -> None:
    """On the CPU accelerator, DeepSpeed's communication backend JIT-builds its shared-memory
    all-reduce extension (C++ with OpenMP) when it starts: about 90 s of CPU the first time in an
    environment, and again whenever the environment moves (the build is keyed by its include
    paths), with every other rank waiting on the build's lock. Only DeepSpeed's inference
    all-reduce uses it, falling back to torch.distributed without it; fsframework's collectives are
    torch.distributed's. It is marked incompatible, so the backend starts without building it.
    Call before `deepspeed.initialize`; a no-op off the CPU accelerator."""
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        return
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__[SHARED_MEMORY_ALLREDUCE_OP] = False  # probed on first access (~0.3 s)
