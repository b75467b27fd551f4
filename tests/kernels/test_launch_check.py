"""The launch check (`fsf info`, tools/gpu_check.sh) compiles one tiny kernel, runs it and reports the
result (here on the interpreter, which the GPU path shares but for the device). Torch and triton
alone: tools/gpu_check.sh runs this folder on a GPU machine without the training stack."""

import torch

from fsframework.ops.launch_check import kernel_launch_check


def test_the_launch_check_runs_a_kernel_and_compares_it(device):
    report = kernel_launch_check(device)
    where = "CUDA " if device == "cuda" else "the CPU interpreter"
    assert report.startswith(f"yes ({where}") and "window attention compiled and ran" in report, report


def test_a_kernel_that_fails_is_reported_not_raised(monkeypatch, device):
    import fsf_kernels.window_attention as window

    def broken(*args, **kwargs):
        raise RuntimeError("out of resources: shared memory")

    monkeypatch.setattr(window, "sliding_window_attention", broken)
    report = kernel_launch_check(device)
    assert report.startswith("NO: the window-attention kernel failed") and "shared memory" in report, report


def test_the_launch_check_without_a_device_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert kernel_launch_check("cuda") == "NO: no CUDA device is visible to torch"
