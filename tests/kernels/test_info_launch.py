"""`fsf info` launches one tiny kernel where kernels can run and reports the result (here on the
interpreter, which the GPU path shares but for the device)."""

import torch

from fsframework.cli import info


def test_the_launch_check_runs_a_kernel_and_compares_it():
    report = info.kernel_launch_check("cpu")
    assert report.startswith("yes (the CPU interpreter: window attention compiled and ran"), report


def test_a_kernel_that_fails_is_reported_not_raised(monkeypatch):
    import fsf_kernels.window_attention as window

    def broken(*args, **kwargs):
        raise RuntimeError("out of resources: shared memory")

    monkeypatch.setattr(window, "sliding_window_attention", broken)
    report = info.kernel_launch_check("cpu")
    assert report.startswith("NO: the window-attention kernel failed") and "shared memory" in report, report


def test_without_a_gpu_the_status_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert info.triton_status().startswith("no GPU")


def test_the_launch_check_without_a_device_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert info.kernel_launch_check("cuda") == "NO: no CUDA device is visible to torch"
