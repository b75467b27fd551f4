"""A DeepSpeed engine starts without compiling DeepSpeed's Muon functions (torch.compile at
import loads torch's inductor: seconds per rank); they are compiled on their first call instead."""

from __future__ import annotations

import subprocess
import sys

import torch

from fsframework.parallel.deepspeed_start import compiled_on_first_call
from tests.utils import REPO

# a fresh process: the Muon modules imported lazily leave the inductor unloaded, the check that
# imports them answers, and DeepSpeed's decorator is its own again afterwards
PROBE = """
import sys
import deepspeed
from deepspeed.runtime import compiler
from fsframework.parallel.deepspeed_start import import_muon_lazily
import_muon_lazily()
from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam
from deepspeed.runtime.zero.muon.original_muon import muon_update
print("torch._inductor.compile_fx" in sys.modules, callable(muon_update), compiler.compile() is __import__("torch").compile)
"""


def test_muon_is_imported_without_loading_the_inductor():
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO), "DS_ACCELERATOR": "cpu", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True", "True"], proc.stdout + proc.stderr


def test_a_deferred_function_is_compiled_once_on_its_first_call(monkeypatch):
    compiled = []

    def fake_compile(fn):
        compiled.append(fn)
        return lambda *args: fn(*args) + 1

    monkeypatch.setattr(torch, "compile", fake_compile)
    double = compiled_on_first_call(lambda x: 2 * x)
    assert compiled == []  # nothing compiled when decorated
    assert double(3) == 7 and double(4) == 9  # the compiled function runs
    assert len(compiled) == 1


def test_a_cpu_backend_starts_without_building_the_shared_memory_allreduce(monkeypatch):
    # DeepSpeed's CPU communication backend would JIT-build its shared-memory all-reduce (~90 s once
    # per environment, every rank waiting on the build's lock); marked incompatible, nothing is built
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    import importlib

    from deepspeed.ops.op_builder.cpu.comm import ShareMemCommBuilder

    from fsframework.parallel.deepspeed_start import skip_shared_memory_allreduce

    def no_build(self, *args, **kwargs):
        raise AssertionError("the shared-memory all-reduce extension was built")

    monkeypatch.setattr(ShareMemCommBuilder, "load", no_build)
    import deepspeed.ops

    monkeypatch.setitem(deepspeed.ops.__compatible_ops__, "deepspeed_shm_comm", True)  # as probed on Linux
    skip_shared_memory_allreduce()
    assert importlib.import_module("deepspeed.comm.torch").build_shm_op() is None
