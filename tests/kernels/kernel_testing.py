"""Helpers shared by the kernel tests (imported by name: tests/kernels is on sys.path under pytest)."""

from __future__ import annotations

import math

import pytest
import torch

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
on_interpreter = not torch.cuda.is_available()

# relative-RMS bounds vs the fp32 reference. bf16 is looser on the CPU interpreter,
# which rounds fp32 -> bf16 by truncation where the GPU rounds to nearest even.
TOL = {
    torch.float32: 2e-5,
    torch.float16: 5e-3,
    torch.bfloat16: 3e-2 if on_interpreter else 1.5e-2,
}


def rel_rms(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want||_rms / ||want||_rms in fp64 (0 when both are 0)."""
    got, want = got.double(), want.double()
    assert got.shape == want.shape, (got.shape, want.shape)
    assert torch.isfinite(got).all(), "non-finite values in the kernel output"
    den = want.pow(2).mean().sqrt().item()
    num = (got - want).pow(2).mean().sqrt().item()
    return num / den if den > 0 else num


# worst-row bounds: the largest error of any one row (a query's output, a key's gradient) against
# the RMS of the reference. An average can hide one wrong row (a tail tile, a masked edge); this
# cannot. An element of a half-precision result is off by a few ulps of itself, and elements run to
# several times the RMS, hence the factor over the RMS bounds.
ROW_TOL = {dtype: 10 * tol for dtype, tol in TOL.items()}


def worst_row(got: torch.Tensor, want: torch.Tensor) -> float:
    """max over rows of max |got - want| along the last axis, over the RMS of `want` (fp64)."""
    got, want = got.double(), want.double()
    den = want.pow(2).mean().sqrt().item()
    err = (got - want).abs().amax(-1).max().item() if got.numel() else 0.0
    return err / den if den > 0 else err


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, name: str,
                 baseline: torch.Tensor | None = None) -> None:
    """`got` within the dtype's bounds of the fp32 reference `want`. A half-precision `baseline` (the
    same quantity computed by PyTorch in `dtype` itself) widens each bound to twice its own error, as
    flash-attention's tests judge a kernel: a half-precision result may round as much as plain
    PyTorch in that precision does, and no more than twice that."""
    rel_bound, row_bound, against = TOL[dtype], ROW_TOL[dtype], ""
    if baseline is not None:
        base_rel, base_row = rel_rms(baseline, want), worst_row(baseline, want)
        rel_bound, row_bound = max(rel_bound, 2 * base_rel), max(row_bound, 2 * base_row)
        against = f" (PyTorch in {str(dtype).split('.')[-1]}: {base_rel:.3e} relative RMS, worst row {base_row:.3e})"
    err = rel_rms(got, want)
    assert err <= rel_bound, f"{name}: relative RMS error {err:.3e} > {rel_bound:.1e}{against}"
    row = worst_row(got, want)
    assert row <= row_bound, f"{name}: worst row's max error {row:.3e} (of the reference's RMS) > " \
                             f"{row_bound:.1e}{against}"


def routing_scores(q, k, cells, *, cell_size, block_size, sigma, lam):
    """fp64 Eq. 7 scores of the listed cells `[B, N, H, K]` (-inf where -1), to judge near-ties."""
    bsz, seq, heads, dim = q.shape
    num = seq // cell_size
    kc = k[:, : num * cell_size].double().view(bsz, num, cell_size, heads, dim)
    kbar, a = kc.mean(2), kc.norm(dim=-1).amax(2)  # B C H D, B C H
    c = cells.clamp_min(0)
    idx = c.permute(0, 2, 1, 3).reshape(bsz, heads, -1)  # B H (N K)
    kb = kbar.transpose(1, 2).gather(2, idx[..., None].expand(-1, -1, -1, dim)).view(bsz, heads, seq, -1, dim)
    ab = a.transpose(1, 2).gather(2, idx).view(bsz, heads, seq, -1)
    content = torch.einsum("bnhd,bhnkd->bnhk", q.double(), kb) / math.sqrt(dim)
    sig = torch.as_tensor(sigma, dtype=torch.float64).expand(heads)
    lm = torch.as_tensor(lam, dtype=torch.float64).expand(heads)
    pos = torch.arange(seq, dtype=torch.float64)[None, :, None, None]
    center = (c.double() + 0.5) * cell_size
    prior = lm[:, None] * ab.permute(0, 2, 1, 3) * torch.erf((pos - center) / (2 * sig[:, None]))
    return torch.where(cells >= 0, content + prior, -math.inf)


def kernel_launches(monkeypatch, fn) -> dict:
    """Triton kernel launches while `fn()` runs, by (kernel name, its `DOCS` flag or None): calls of a
    kernel's `run`, warm-ups aside (the interpreter's `InterpretedFunction` or the compiled
    `JITFunction`, as tools/bench_documents.py counts them)."""
    from collections import Counter

    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    counts = Counter()
    with monkeypatch.context() as patch:
        for cls in (InterpretedFunction, JITFunction):
            def run(fn_self, *args, _original=cls.__dict__["run"], **kwargs):
                if not kwargs.get("warmup", False):
                    counts[getattr(fn_self, "__name__", "?"), kwargs.get("DOCS")] += 1
                return _original(fn_self, *args, **kwargs)

            patch.setattr(cls, "run", run)
        fn()
    return dict(counts)


def laid_out_documents(documents, cell_size, block_size):
    """Per-document (q, k) `[B, L, H, d]` end to end in one row, each from a block boundary, zeros after it
    to the next one (`fsframework.ops.freesolo_documents`'s layout) -> (q, k) `[B, R, H, d]`, first_cells
    `[R / block_size]` (CPU LongTensor), each document's first row."""
    lengths = [q.shape[1] for q, _ in documents]
    padded = [-(-n // block_size) * block_size for n in lengths]
    bsz, _, heads, dim = documents[0][0].shape
    q_row, k_row = (torch.zeros(bsz, sum(padded), heads, dim) for _ in range(2))
    firsts, offsets, offset = [], [], 0
    for (q, k), n, p in zip(documents, lengths, padded):
        q_row[:, offset:offset + n], k_row[:, offset:offset + n] = q, k
        firsts += [offset // cell_size] * (p // block_size)
        offsets.append(offset)
        offset += p
    return q_row, k_row, torch.tensor(firsts), offsets
