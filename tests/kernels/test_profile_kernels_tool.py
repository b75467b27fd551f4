"""`tools/profile_kernels.py` profiles kernel calls on a CUDA GPU (torch.profiler, CUDA sync debug mode), so on
the CPU the test runs what the CPU reaches: its command line (`main`, which parses the arguments and then
stops with its no-GPU message) and every call it would profile, built as the tool builds them: the FreeSolo
kernels' and rewired attention's calls under TRITON_INTERPRET=1, and the whole training steps (`--models`,
`--batches`) in fp32, each run once. On a GPU machine the same test runs the profiler itself at these
small sizes."""

from __future__ import annotations

import torch

from tests.utils import run_tool

CODE = """import torch, profile_kernels as pk
print("main:", pk.main())
if not torch.cuda.is_available():
    args = pk.parse_args()
    calls = {**pk.freesolo_calls(256, args, device="cpu"), **pk.rewired_calls(128, args, device="cpu"),
             **pk.model_steps(args, device="cpu")}
    for label, call in calls.items():
        out = call()
        outs = [] if out is None else [out] if isinstance(out, torch.Tensor) else list(out)
        print("ran", label, "finite" if all(t.float().isfinite().all() for t in outs) else "NOT FINITE")
"""

CALLS = ["swa fwd", "swa fwd+bwd", "readout by_cell fwd", "readout by_cell fwd+bwd", "readout atomic fwd",
         "readout atomic fwd+bwd", "routing fs fwd", "routing fsl fwd",
         "dense fwd", "dense fwd+bwd", "rewired fwd", "rewired fwd+bwd",
         "tfpp B1 step", "tfpp B2 step", "fs B1 step", "fs B2 step"]


def test_command_line_and_the_profiled_calls():
    proc = run_tool("profile_kernels.py", "--sizes", "256", "--rewired", "128", "--models", "tfpp,fs",
                    "--batches", "1,2", "--model-len", "128", "--d-model", "32", "--layers", "1", "--heads", "1",
                    "--dim", "16", "--window", "64", "--vocab", "64", "--top", "2", code=CODE,
                    env=None if torch.cuda.is_available() else {"TRITON_INTERPRET": "1"})
    if torch.cuda.is_available():
        assert "main: 0" in proc.stdout and "failed with" not in proc.stdout
        assert all(f"  {label}" in proc.stdout for label in CALLS)
    else:
        assert "main: 1" in proc.stdout and "needs a CUDA GPU" in proc.stderr
        assert [line for line in proc.stdout.splitlines() if line.startswith("ran ")] == [
            f"ran {label} finite" for label in CALLS]
