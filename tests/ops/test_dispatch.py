"""`fsframework.ops.dispatch.kernel_for`: which implementation each `impl` picks, and how a kernel that
cannot be imported is reported."""

from __future__ import annotations

import sys
import types
import warnings

import pytest
import torch

from fsframework.models.freesolo_settings import fs_config, fs_prior
from fsframework.ops import dispatch
from fsframework.ops.dispatch import IMPLS, kernel_for
from fsframework.ops.freesolo import cell_readout, select_cells
from fsframework.ops.local_attention import sliding_window_attention, window_attention_sdpa
from fsframework.ops.rope import rotate

FAKE = "fsf_kernels.fake_op"  # a stand-in kernel module, put into sys.modules by the tests


class CudaLike:
    """What `kernel_for` reads of a tensor: `is_cuda`, and the device whose shared memory it asks."""

    is_cuda = True
    device = torch.device("cuda", 0)


@pytest.fixture(autouse=True)
def h100_like(monkeypatch):
    """The pretend CUDA device has an sm_90's shared memory per block (tests change it)."""
    from fsf_kernels.common import support

    monkeypatch.setattr(support, "_shared_per_block", lambda device: 232_448)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Pretend GPU")


@pytest.fixture
def fake_kernel(monkeypatch):
    module = types.ModuleType(FAKE)
    module.op = lambda *args, **kwargs: "kernel"
    monkeypatch.setitem(sys.modules, FAKE, module)
    return module.op


@pytest.fixture
def broken_kernel(monkeypatch):
    """The import of the stand-in module fails; `auto`'s once-only report starts afresh."""
    monkeypatch.setitem(sys.modules, FAKE, None)
    monkeypatch.setattr(dispatch, "_warned", set())


def test_impls():
    assert IMPLS == ("auto", "reference", "triton")


def test_choice_on_cpu_tensors(fake_kernel):
    x = torch.zeros(1)
    assert kernel_for("fake_op", "op", "reference", x) is None
    assert kernel_for("fake_op", "op", "auto", x) is None
    assert kernel_for("fake_op", "op", "triton", x) is fake_kernel


def test_choice_on_cuda_tensors(fake_kernel):
    assert kernel_for("fake_op", "op", "reference", CudaLike()) is None
    assert kernel_for("fake_op", "op", "auto", CudaLike()) is fake_kernel
    assert kernel_for("fake_op", "op", "triton", CudaLike()) is fake_kernel


def test_reference_and_cpu_auto_never_import_the_kernel(broken_kernel):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernel_for("fake_op", "op", "reference", CudaLike()) is None
        assert kernel_for("fake_op", "op", "auto", torch.zeros(1)) is None


@pytest.mark.parametrize("impl", ["cuda", "Triton", "", None])
def test_unknown_impl_names_the_allowed_values(impl):
    with pytest.raises(ValueError, match=r"impl must be one of \('auto', 'reference', 'triton'\)"):
        kernel_for("fake_op", "op", impl, torch.zeros(1))


@pytest.mark.parametrize("call", [
    lambda x: select_cells(x, x, fs_config(impl="gpu"), fs_prior()),
    lambda x: cell_readout(x, x, x, torch.full((*x.shape[:3], 1), -1), fs_config(impl="gpu")),
    lambda x: sliding_window_attention(x, x, x, window=2, impl="gpu"),
], ids=["select_cells", "cell_readout", "sliding_window_attention"])
def test_every_op_validates_impl(call):
    with pytest.raises(ValueError, match="impl must be one of"):
        call(torch.zeros(1, 8, 1, 4))


def test_triton_raises_naming_the_reason(broken_kernel):
    for tensor in (torch.zeros(1), CudaLike()):
        with pytest.raises(RuntimeError, match=r"impl='triton'.*fsf_kernels\.fake_op\.op.*ModuleNotFoundError"):
            kernel_for("fake_op", "op", "triton", tensor)


def test_triton_raises_on_a_missing_function(fake_kernel):
    with pytest.raises(RuntimeError, match=r"fsf_kernels\.fake_op\.missing.*AttributeError"):
        kernel_for("fake_op", "missing", "triton", torch.zeros(1))


def test_auto_on_cuda_warns_once_then_falls_back(broken_kernel):
    with pytest.warns(RuntimeWarning, match=r"impl='auto'.*fsf_kernels\.fake_op\.op.*ModuleNotFoundError.*PyTorch"):
        assert kernel_for("fake_op", "op", "auto", CudaLike()) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second report would raise here
        assert kernel_for("fake_op", "op", "auto", CudaLike()) is None
    # another kernel's failure is reported on its own
    with pytest.warns(RuntimeWarning, match=r"fsf_kernels\.fake_op\.other"):
        assert kernel_for("fake_op", "other", "auto", CudaLike()) is None


def test_an_op_on_cuda_falls_back_to_pytorch_with_a_warning(monkeypatch):
    """The whole path of an op: "auto" on a (pretend) CUDA tensor whose kernel fails to import runs the
    window's fused PyTorch form, as on the CPU."""
    monkeypatch.setitem(sys.modules, "fsf_kernels.window_attention", None)
    monkeypatch.setattr(dispatch, "_warned", set())
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 12, 2, 8, generator=gen) for _ in range(3))
    assert q.is_cuda
    with pytest.warns(RuntimeWarning, match="fsf_kernels.window_attention.sliding_window_attention"):
        got = sliding_window_attention(q, k, v, window=3, impl="auto")
    assert torch.equal(got, window_attention_sdpa(rotate(q, 10000.0), rotate(k, 10000.0), v, window=3))
    torch.testing.assert_close(got, sliding_window_attention(q, k, v, window=3, impl="reference"))


def test_a_call_the_kernel_does_not_support(fake_kernel, monkeypatch):
    """"auto" runs the reference for it (reported once per reason), "triton" refuses it by name."""
    monkeypatch.setattr(dispatch, "_warned", set())
    why = "head dim 300 (the kernels take 1..256)"
    with pytest.raises(ValueError, match=r"impl='triton'.*fake_op\.op does not support head dim 300"):
        kernel_for("fake_op", "op", "triton", torch.zeros(1), why)
    with pytest.warns(RuntimeWarning, match=r"impl='auto'.*does not support head dim 300.*PyTorch"):
        assert kernel_for("fake_op", "op", "auto", CudaLike(), why) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernel_for("fake_op", "op", "auto", CudaLike(), why) is None  # reported once
        assert kernel_for("fake_op", "op", "auto", torch.zeros(1), why) is None  # CPU: the reference anyway
        assert kernel_for("fake_op", "op", "reference", CudaLike(), why) is None
        assert kernel_for("fake_op", "op", "auto", CudaLike(), None) is fake_kernel


def test_the_ops_ask_what_the_kernels_support():
    """The limits reach the ops: a call beyond them is refused under "triton" before any kernel runs."""
    x = torch.zeros(1, 64, 1, 8)
    with pytest.raises(ValueError, match="top_k=65"):
        select_cells(x, x, fs_config(top_k=65, cell_size=4, block_size=8, impl="triton"), fs_prior())
    with pytest.raises(ValueError, match="retained_cells=1025"):
        select_cells(x, x, fs_config("fsl", retained_cells=1025, cell_size=4, block_size=8, impl="triton"), fs_prior())
    with pytest.raises(ValueError, match="dtype torch.float64"):
        sliding_window_attention(x.double(), x.double(), x.double(), window=2, impl="triton")
    wide = torch.zeros(1, 64, 1, 256)
    with pytest.raises(ValueError, match="cell_size=64 at head dim 256"):
        cell_readout(wide, wide, wide, torch.full((1, 64, 1, 1), -1), fs_config(cell_size=64, impl="triton"))


def test_the_limits():
    from fsf_kernels.common import support

    bf16, f32 = torch.bfloat16, torch.float32
    assert support.window_unsupported(bf16, 256, rope=True) is None
    assert "head dim 257" in support.window_unsupported(bf16, 257, rope=False)
    assert "odd head dim" in support.window_unsupported(bf16, 63, rope=True)
    assert support.routing_unsupported(f32, 64, fs_config("fsl", top_k=64, retained_cells=1024)) is None
    assert "retained_cells=1025" in support.routing_unsupported(f32, 64, fs_config("fsl", top_k=4, retained_cells=1025))
    assert support.routing_unsupported(f32, 64, fs_config("fs", top_k=4, retained_cells=1025)) is None  # P unused
    assert "variant 'fsb'" in support.routing_unsupported(f32, 64, fs_config("fsb", top_k=4))
    assert support.readout_unsupported(bf16, 256, top_k=64, cell_size=32) is None
    assert support.readout_unsupported(f32, 64, top_k=4, cell_size=128) is None
    assert "cell_size <= 32" in support.readout_unsupported(f32, 200, top_k=4, cell_size=33)
    assert support.scan_unsupported(bf16, 1536) is None
    assert "scan width 4096" in support.scan_unsupported(bf16, 4096)
    # the window tiles change with the target only where sm_80's smaller shared memory needs it
    assert support.window_tiles(bf16, 256, 90) == (64, 64, 2)
    assert support.window_tiles(bf16, 256, 80) == (32, 32, 3)
    assert support.window_tiles(f32, 128, 80) == support.window_tiles(f32, 128, 90) == (32, 32, 3)


def test_devices_run_the_tiles_of_the_largest_target_their_shared_memory_holds(monkeypatch):
    from fsf_kernels.common import support

    assert support.target_for_shared_memory(232_448) == 90  # H100 / H200; B200 has the same
    assert support.target_for_shared_memory(166_912) == 80  # A100
    assert support.target_for_shared_memory(101_376) == 86  # A10, L4, L40, RTX 30xx / 40xx / 50xx
    assert support.target_for_shared_memory(65_536) is None  # T4
    assert support.device_target(torch.device("cpu")) == 90
    monkeypatch.setattr(support, "_shared_per_block", lambda device: 101_376)
    assert support.device_target(torch.device("cuda", 0)) == 86
    assert support.device_unsupported(torch.device("cuda", 0)) is None


def test_a_gpu_with_too_little_shared_memory_runs_the_references(fake_kernel, monkeypatch):
    from fsf_kernels.common import support

    monkeypatch.setattr(support, "_shared_per_block", lambda device: 65_536)
    monkeypatch.setattr(dispatch, "_warned", set())
    with pytest.raises(ValueError, match=r"does not support Pretend GPU \(65,536 B .* at least 101,376 B\)"):
        kernel_for("fake_op", "op", "triton", CudaLike())
    with pytest.warns(RuntimeWarning, match="Pretend GPU"):
        assert kernel_for("fake_op", "op", "auto", CudaLike()) is None
    assert kernel_for("fake_op", "op", "triton", torch.zeros(1)) is fake_kernel  # the interpreter on CPU


def test_the_small_target_takes_smaller_tiles_where_its_shared_memory_needs_it():
    from fsf_kernels.common import support
    from fsf_kernels.rewired_attention.rewired_attention import tiles

    bf16, f32 = torch.bfloat16, torch.float32
    for dtype in (bf16, f32):
        for dim in (16, 32, 64, 128, 256):
            big, small = support.window_tiles(dtype, dim, 80), support.window_tiles(dtype, dim, 86)
            assert small[0] * small[1] * small[2] <= big[0] * big[1] * big[2]
            assert tiles(dtype, dim, 86) <= tiles(dtype, dim, 80)
            assert support.routing_cell_tile(dim, 86) <= support.routing_cell_tile(dim, 80)
            for cell in (8, 32):
                assert support.readout_stages(dtype, dim, cell, 86) <= support.readout_stages(dtype, dim, cell, 80)
    assert support.window_tiles(bf16, 64, 86) == (64, 64, 3)  # unchanged where it fits
    assert tiles(f32, 256, 86) == 16 and support.routing_cell_tile(256, 86) == 16
