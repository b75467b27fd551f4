"""`tools/bench_kernels.py` times the Triton kernels on a CUDA GPU (triton's do_bench), so on the CPU the test
runs what the CPU reaches: its command line (`main`, which parses the arguments and then stops with its
no-GPU message) and its correctness pass, the kernels against the PyTorch references as the tool calls
them, under TRITON_INTERPRET=1 at a small shape. On a GPU machine the same test runs the benchmark itself
at one small size."""

from __future__ import annotations

import torch

from tests.utils import run_tool

CODE = """import torch, bench_kernels
print("main:", bench_kernels.main())
device = "cuda" if torch.cuda.is_available() else "cpu"
print("check:", bench_kernels.correctness_check(device, shape=(1, 300, 1, 16)))
"""


def test_command_line_and_correctness_pass():
    proc = run_tool("bench_kernels.py", "--sizes", "512", "--heads", "1", "--dim", "16", "--budget-s", "120",
                    code=CODE,
                    env=None if torch.cuda.is_available() else {"TRITON_INTERPRET": "1"})
    if torch.cuda.is_available():
        assert "main: 0" in proc.stdout and "N = 512" in proc.stdout and "failed" not in proc.stdout
    else:
        assert "main: 1" in proc.stdout and "no CUDA device found" in proc.stderr
    checks = [line for line in proc.stdout.splitlines() if line.startswith("check ")]
    assert [line.split()[1] for line in checks] == ["swa", "fs", "fsl", "readout"]
    assert "check: True" in proc.stdout  # every kernel within the tool's tolerances of its reference
