"""Every kernel compiles for sm_80, sm_86 and sm_90 and its shared memory fits the target: no GPU needed.

Triton compiles for a CUDA target on a CPU-only machine with its bundled ptxas; a launch whose
shared memory exceeds the block limit would fail only on the device. The compiles run in one
subprocess without TRITON_INTERPRET (this directory's conftest turns the interpreter on, and an
interpreted kernel cannot be compiled); launches shared by configurations compile once. The
default suite checks the representative set of `fsf_kernels.compile_check` (each kernel at its
extremes: d = 256, the largest K and P and cell, fp32 and half); `python -m
fsf_kernels.compile_check --full` sweeps every configuration (many minutes; docs/kernels.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fsf_kernels.common.targets import TARGETS
from fsf_kernels.compile_check import configurations

ROOT = Path(__file__).resolve().parents[2]
CASES = [(config.name, arch) for config in configurations() for arch in TARGETS]


@pytest.fixture(scope="module")
def compiled() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "fsf_kernels.compile_check", "--json"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert rows, f"no compile results (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    out: dict = {}
    for row in rows:
        out.setdefault((row["config"], row["arch"]), []).append(row)
    return out


@pytest.mark.parametrize("name, arch", CASES, ids=[f"{name}-sm{arch}" for name, arch in CASES])
def test_compiles_and_fits_shared_memory(compiled, name, arch):
    rows = compiled.get((name, arch))
    assert rows, f"{name} was not compiled for sm_{arch}"
    for row in rows:
        assert row["error"] is None, f"{row['kernel']} does not compile for sm_{arch}: {row['error']}"
        assert row["shared"] <= row["limit"], (f"{row['kernel']} needs {row['shared']:,} B of shared memory, "
                                               f"sm_{arch} allows {row['limit']:,} B per block")


def test_the_representative_set_covers_every_kernel_and_the_extremes():
    from fsf_kernels.common import support

    configs = configurations()
    assert {c.kernel for c in configs} == {"window", "routing", "readout", "rewired", "grc_scan", "fsb_search",
                                           "common"}
    params = [dict(c.params) for c in configs]
    assert max(p.get("dim", 0) for p in params) == support.MAX_HEAD_DIM
    routing = [p for c, p in zip(configs, params) if c.kernel == "routing"]
    readout = [p for c, p in zip(configs, params) if c.kernel == "readout"]
    assert max(p["top_k"] for p in routing) == support.MAX_TOP_K
    assert max(p["retained"] for p in routing) == support.MAX_RETAINED
    assert max(p["top_k"] for p in readout) == support.MAX_TOP_K
    assert max(p["cell_size"] for p in readout) == support.MAX_CELL_SIZE
    assert max(support.padded_dim(p["cell_size"]) * p["dim"] for p in readout) == support.MAX_CELL_TILE
    assert max(p["beam_width"] for c, p in zip(configs, params) if c.kernel == "fsb_search") == support.MAX_BEAM_WIDTH
