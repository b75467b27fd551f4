"""Benchmark the FreeSolo Triton kernels on one CUDA GPU.

Layers timed (bf16, batch 1, 16 heads of 64 by default), forward and forward+backward:
  dense  torch scaled_dot_product_attention, causal, flash backend
  swa    sliding-window attention kernel only (window 512, RoPE)
  fs     swa + FS routing + selected-cell readout (the FreeSolo layer's attention, combine = sum)
  fsl    the same with FS-L routing
plus the routing and readout kernels alone, and the readout's effective bandwidth:
bytes a per-query gather would move (K cells x s tokens x (k, v) per query and head)
divided by the readout's forward time, next to the H200's ~4.8 TB/s.

A quick correctness pass against the references runs first (a benchmark reports a
speedup only when the same code is correct). Each size runs in its own try block,
so an out-of-memory error skips that size; `--budget-s` stops before a size would
start past the time budget.

Usage: python tools/bench_kernels.py [--sizes 4096,16384,65536,131072,262144] [--budget-s 300]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

from fsframework.models.freesolo_settings import fs_config, fs_prior

HBM_TBPS = 4.8  # H200 HBM3e


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="4096,16384,65536,131072,262144")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--budget-s", type=float, default=330.0, help="skip sizes that would start after this")
    p.add_argument("--skip-check", action="store_true")
    return p.parse_args()


def rel_rms(a, b):
    a, b = a.double(), b.double()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def correctness_check(device, shape=(1, 2053, 4, 64)) -> bool:
    """Kernels vs references at a moderate size, bf16 inputs, fp32 references."""
    from fsframework.ops.freesolo import cell_readout as ref_readout
    from fsframework.ops.freesolo import select_cells as ref_select
    from fsframework.ops.local_attention import sliding_window_attention as ref_swa
    from fsf_kernels.cell_readout import cell_readout
    from fsf_kernels.cell_routing import select_cells
    from fsf_kernels.window_attention import sliding_window_attention

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*shape, generator=gen).to(device, torch.bfloat16).requires_grad_() for _ in range(3))
    g = torch.randn(shape, generator=gen).to(device, torch.bfloat16)
    ok = True
    f32 = [x.detach().float().requires_grad_() for x in (q, k, v)]

    out = sliding_window_attention(q, k, v, window=512)
    grads = torch.autograd.grad(out, (q, k, v), g)
    ref = ref_swa(*f32, window=512, impl="reference")
    want = torch.autograd.grad(ref, f32, g.float())
    errs = [rel_rms(out, ref)] + [rel_rms(a, b) for a, b in zip(grads, want)]
    ok &= max(errs) < 2e-2
    print(f"check swa      out/dq/dk/dv rel-RMS: " + " ".join(f"{e:.1e}" for e in errs))

    for variant in ("fs", "fsl"):
        got = select_cells(q.detach(), k.detach(), fs_config(variant), fs_prior())
        want_c = ref_select(q.detach().float(), k.detach().float(), fs_config(variant, impl="reference"),
                            fs_prior())
        agree = (got == want_c).all(-1).float().mean().item()
        ok &= agree > 0.98  # tf32 content scores may reorder near-ties
        print(f"check {variant:<4} routing rows identical to the reference: {agree:.4f}")

    cells = ref_select(q.detach().float(), k.detach().float(), fs_config("fs", impl="reference"), fs_prior())
    w = torch.ones(shape[2], shape[3], device=device, dtype=torch.bfloat16, requires_grad=True)
    out = cell_readout(q, k, v, cells, fs_config(), rms_weight=w)
    grads = torch.autograd.grad(out, (q, k, v, w), g)
    f32w = w.detach().float().requires_grad_()
    ref = ref_readout(*f32, cells, fs_config(impl="reference"), rms_weight=f32w)
    want = torch.autograd.grad(ref, (*f32, f32w), g.float())
    errs = [rel_rms(out, ref)] + [rel_rms(a, b) for a, b in zip(grads, want)]
    ok &= max(errs) < 2e-2
    print(f"check readout  out/dq/dk/dv/dg rel-RMS: " + " ".join(f"{e:.1e}" for e in errs))
    return ok


def bench(fn, rep_ms=200.0) -> float:
    """Median milliseconds of fn() (L2 flushed between calls by triton's do_bench)."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")


def layers(window):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fsf_kernels.cell_readout import cell_readout
    from fsf_kernels.cell_routing import select_cells
    from fsf_kernels.window_attention import sliding_window_attention

    def dense(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            # B T H D -> B H T D
            o = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return o.transpose(1, 2)

    def swa(q, k, v):
        return sliding_window_attention(q, k, v, window=window)

    def freesolo(variant):
        def layer(q, k, v):
            cells = select_cells(q.detach(), k.detach(), fs_config(variant), fs_prior())
            return sliding_window_attention(q, k, v, window=window) + cell_readout(q, k, v, cells, fs_config())
        return layer

    return {"dense": dense, "swa": swa, "fs": freesolo("fs"), "fsl": freesolo("fsl")}


def run_size(n, args, device, fns):
    from fsf_kernels.cell_readout import cell_readout
    from fsf_kernels.cell_routing import select_cells

    shape = (1, n, args.heads, args.dim)
    q, k, v = (torch.randn(shape, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn(shape, device=device, dtype=torch.bfloat16)
    row = {}
    for name, fn in fns.items():
        try:
            row[name, "fwd"] = bench(lambda: fn(q, k, v))
            row[name, "fwdbwd"] = bench(lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), g))
        except torch.cuda.OutOfMemoryError:
            row[name, "fwd"] = row[name, "fwdbwd"] = math.nan
            print(f"  N={n} {name}: out of memory, skipped", flush=True)
        torch.cuda.empty_cache()
    for variant in ("fs", "fsl"):
        config = fs_config(variant)
        row["route_" + variant] = bench(lambda: select_cells(q.detach(), k.detach(), config, fs_prior()))
    cells = select_cells(q.detach(), k.detach(), fs_config("fsl"), fs_prior())
    row["readout"] = bench(lambda: cell_readout(q, k, v, cells, fs_config()))
    for dkdv in ("by_cell", "atomic"):  # the backward's two ways to form dk/dv, side by side
        row["readout_fwdbwd_" + dkdv] = bench(
            lambda: torch.autograd.grad(cell_readout(q, k, v, cells, fs_config(), dkdv=dkdv), (q, k, v), g))
    top_k, cell = cells.shape[-1], 32
    gather_bytes = n * args.heads * top_k * cell * args.dim * 2 * 2  # k and v, bf16, per query and head
    row["readout_tbps"] = gather_bytes / (row["readout"] * 1e-3) / 1e12
    row["unique_frac"] = unique_fraction(cells)
    return row


def unique_fraction(cells):
    """Distinct cells per 16-query tile / (16 * K): the share of K/V tile loads the grouping keeps."""
    from fsf_kernels.cell_readout import unique_cells

    _, count = unique_cells(cells, 16)
    return (count.double().sum() / (count.numel() * 16 * cells.shape[-1])).item()


def report(n, row):
    d = row.get(("dense", "fwd"), math.nan)
    db = row.get(("dense", "fwdbwd"), math.nan)
    print(f"\nN = {n}")
    print(f"  {'layer':<6} {'fwd ms':>9} {'x dense':>8} {'fwd+bwd ms':>11} {'x dense':>8}")
    for name in ("dense", "swa", "fs", "fsl"):
        f, fb = row[name, "fwd"], row[name, "fwdbwd"]
        print(f"  {name:<6} {f:9.3f} {d / f:8.2f} {fb:11.3f} {db / fb:8.2f}")
    print(f"  routing fwd ms: fs {row['route_fs']:.3f}, fsl {row['route_fsl']:.3f}")
    print(f"  readout ms: fwd {row['readout']:.3f}, fwd+bwd {row['readout_fwdbwd_by_cell']:.3f} "
          f"(dk/dv by cell; atomic {row['readout_fwdbwd_atomic']:.3f}); "
          f"effective {row['readout_tbps']:.2f} TB/s of gathered K/V vs {HBM_TBPS} TB/s HBM "
          f"(distinct cells per tile: {100 * row['unique_frac']:.0f}% of selections)", flush=True)


def main() -> int:
    args = parse_args()  # first: `--help` answers on any machine
    if not torch.cuda.is_available():
        print("bench_kernels: no CUDA device found; this benchmark needs a GPU (the kernels' CPU tests are in "
              "tests/kernels, run under TRITON_INTERPRET=1).", file=sys.stderr)
        return 1
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("bench_kernels: TRITON_INTERPRET=1 is set; unset it to time compiled kernels.", file=sys.stderr)
        return 1
    device = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    t0 = time.time()
    if not args.skip_check and not correctness_check(device):
        print("bench_kernels: correctness check FAILED; not reporting speedups.", file=sys.stderr)
        return 2
    fns = layers(args.window)
    for n in (int(s) for s in args.sizes.split(",")):
        elapsed = time.time() - t0
        if elapsed > args.budget_s:
            print(f"\nN = {n}: skipped, {elapsed:.0f}s past the {args.budget_s:.0f}s budget")
            continue
        try:
            report(n, run_size(n, args, device, fns))
        except torch.cuda.OutOfMemoryError:
            print(f"\nN = {n}: out of memory, skipped")
        except Exception as exc:  # keep measuring the other sizes; the error is printed
            print(f"\nN = {n}: failed with {type(exc).__name__}: {exc}")
        torch.cuda.empty_cache()
    print(f"\ntotal {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
