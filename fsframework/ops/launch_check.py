"""One tiny kernel compiled, launched and compared with its reference: the toolchain check that
`fsf info` and tools/gpu_check.sh run. It lives with the references (torch and triton alone) so a
GPU machine with neither the data nor the training stack installed can run it."""

from __future__ import annotations

import time

import torch

from fsf_kernels.common.support import SHARED_LIMIT, device_target, device_unsupported  # torch only
from fsframework.ops.local_attention import sliding_window_attention


def kernel_launch_check(device: str = "cuda") -> str:
    """Compile and launch one tiny kernel (window attention, bf16, forward and backward) and compare
    it with the reference: a toolchain that cannot build or run kernels shows here, not mid-run."""
    if torch.device(device).type == "cuda":
        if not torch.cuda.is_available():
            return "NO: no CUDA device is visible to torch"
        refused = device_unsupported(torch.device(device))
        if refused:
            return f"NO: the kernels do not run on {refused}; models use reference ops"
        major, minor = torch.cuda.get_device_capability(device)
        target = device_target(torch.device(device))
        name = (f"CUDA {torch.cuda.get_device_name(device)}, sm_{major}{minor}, the sm_{target} tiles "
                f"({SHARED_LIMIT[target]:,} B of shared memory per block)")
        sync = torch.cuda.synchronize
    else:  # the interpreter (TRITON_INTERPRET=1): how the tests exercise this check
        name, sync = "the CPU interpreter", lambda device: None
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 96, 2, 64, generator=gen).to(device, torch.bfloat16).requires_grad_() for _ in range(3))
    t0 = time.perf_counter()
    try:
        out = sliding_window_attention(q, k, v, window=32, impl="triton")
        out.float().square().sum().backward()
        sync(device)
    except Exception as exc:  # the point is to report it
        return f"NO: the window-attention kernel failed on {name}: {type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - t0
    want = sliding_window_attention(*(x.detach().float() for x in (q, k, v)), window=32, impl="reference")
    err = (out.float() - want).abs().max().item()
    verdict = "yes" if err < 5e-2 and torch.isfinite(q.grad).all() else "WRONG RESULT"
    return (f"{verdict} ({name}: window attention compiled and ran forward and backward in {seconds:.1f} s, "
            f"max error vs the reference {err:.1e})")
