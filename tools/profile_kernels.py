"""Where a kernel call's time goes on one CUDA GPU: device time, host time, synchronizations.

`bench_kernels.py` times whole calls. At the training length (4k) a call can be bound by the
host (Python, launches, torch glue ops, a device-to-host synchronization that drains the
queue) rather than by its kernels; this tool tells which. For each call (bf16, batch 1, the
same shapes as bench_kernels) at each size it prints

  call ms   the whole call, do_bench median (what bench_kernels reports)
  gpu ms    the device time of the call's kernels (torch.profiler), summed per call
  host ms   the host time to issue one call, 20 calls back to back, no waiting in between
  syncs     device-to-host synchronizations in one call (torch.cuda sync debug mode), with
            the source line of each

then each call's kernels by device time. Calls: sliding-window attention (swa), the
selected-cell readout with dk/dv by cell and atomic, FS and FS-L routing, forward and
forward+backward, rewired attention against flash SDPA (`--rewired`), and whole training steps of
a Transformer++, FS and FS-L model at batch 1 and 4 (`--models`, `--batches`): at which batch a
step stops being bound by the host.

Usage: python tools/profile_kernels.py [--sizes 4096,16384] [--top 8] [--rewired 4096,8192,16384]
       [--models tfpp,fs,fsl] [--batches 1,4]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections import Counter

import torch

from fsframework.models.freesolo_settings import fs_config, fs_prior


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="4096,16384")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--top", type=int, default=8, help="kernels listed per call")
    p.add_argument("--rewired", default="4096,8192,16384", help="sizes for rewired vs SDPA ('' to skip)")
    p.add_argument("--models", default="tfpp,fs,fsl", help="whole training steps of these kinds ('' to skip)")
    p.add_argument("--batches", default="1,4")
    p.add_argument("--model-len", type=int, default=4096)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    return p.parse_args()


def call_ms(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def host_ms(fn, calls: int = 20) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return 1e3 * elapsed / calls


def syncs(fn) -> Counter:
    """Source lines of the device-to-host synchronizations one call makes."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return Counter(f"{w.filename.rsplit('/', 2)[-1]}:{w.lineno}" for w in caught
                   if "synchroniz" in str(w.message))


def kernel_times(fn, calls: int = 10) -> list[tuple[str, float]]:
    """(kernel name, device ms per call), most expensive first."""
    from torch.profiler import ProfilerActivity, profile

    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for event in prof.events():
        device_us = getattr(event, "device_time", None)
        if device_us is None:
            device_us = getattr(event, "cuda_time", 0.0)
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] = totals.get(event.name, 0.0) + device_us / 1e3 / calls
    return sorted(totals.items(), key=lambda kv: -kv[1])


def profile_call(label: str, fn, top: int) -> None:
    try:
        whole, host = call_ms(fn), host_ms(fn)
        kernels = kernel_times(fn)
        where = syncs(fn)
    except Exception as exc:  # keep profiling the other calls; the error is printed
        print(f"  {label}: failed with {type(exc).__name__}: {exc}", flush=True)
        return
    gpu = sum(ms for _, ms in kernels)
    sync_text = ", ".join(f"{n}x {line}" for line, n in where.items()) or "none"
    print(f"  {label:<24} call {whole:7.3f} ms  gpu {gpu:7.3f} ms  host {host:7.3f} ms  "
          f"kernels {len(kernels):3d}  syncs: {sync_text}", flush=True)
    for name, ms in kernels[:top]:
        print(f"      {ms:8.3f} ms  {name[:100]}")


def freesolo_calls(n: int, args, device: str = "cuda") -> dict:
    """The FreeSolo kernels' calls at `n` tokens (`device` "cpu": under TRITON_INTERPRET=1, the tests')."""
    from fsf_kernels.cell_readout import cell_readout
    from fsf_kernels.cell_routing import select_cells
    from fsf_kernels.window_attention import sliding_window_attention

    shape = (1, n, args.heads, args.dim)
    q, k, v = (torch.randn(shape, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn(shape, device=device, dtype=torch.bfloat16)
    cells = select_cells(q.detach(), k.detach(), fs_config("fsl"), fs_prior())

    def both(f):
        return (lambda: f()), (lambda: torch.autograd.grad(f(), (q, k, v), g))

    calls = {}
    for name, f in (
        ("swa", lambda: sliding_window_attention(q, k, v, window=args.window)),
        ("readout by_cell", lambda: cell_readout(q, k, v, cells, fs_config())),
        ("readout atomic", lambda: cell_readout(q, k, v, cells, fs_config(), dkdv="atomic")),
    ):
        calls[name + " fwd"], calls[name + " fwd+bwd"] = both(f)
    for variant in ("fs", "fsl"):
        calls[f"routing {variant} fwd"] = lambda variant=variant: select_cells(q.detach(), k.detach(),
                                                                               fs_config(variant), fs_prior())
    return calls


def rewired_calls(n: int, args, device: str = "cuda") -> dict:
    """Rewired attention's kernel against flash SDPA at `n` tokens (`device` as `freesolo_calls`'; on a CPU
    SDPA runs PyTorch's math backend, not flash)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fsf_kernels.rewired_attention import rewired_attention_rows

    shape = (1, n, args.heads, args.dim)
    q, k, v = (torch.randn(shape, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    r, u = (torch.randn((1, n, args.dim), device=device, dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))
    g = torch.randn(shape, device=device, dtype=torch.bfloat16)
    backend = SDPBackend.FLASH_ATTENTION if device == "cuda" else SDPBackend.MATH

    def dense():
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)

    def rewired():
        return rewired_attention_rows(q, k, v, r, u)

    return {"dense fwd": dense, "dense fwd+bwd": lambda: torch.autograd.grad(dense(), (q, k, v), g),
            "rewired fwd": rewired,
            "rewired fwd+bwd": lambda: torch.autograd.grad(rewired(), (q, k, v, r, u), g)}


def model_steps(args, device: str = "cuda") -> dict:
    """One training step (forward, the per-token losses, backward) per `--models` kind and
    `--batches` size at `--model-len` tokens, bf16 on a GPU: is a whole step bound by the host?"""
    from fsframework.config import AttentionConfig, ModelConfig
    from fsframework.models.registry import build_model
    from fsframework.parallel.batch import RankBatch

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    calls = {}
    for name in (m for m in args.models.split(",") if m):
        cfg = ModelConfig(name=name, vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers,
                          n_heads=args.heads, attention=AttentionConfig(impl="auto"))
        model = build_model(cfg).to(device, dtype)
        for batch in (int(b) for b in args.batches.split(",") if b):
            tokens = torch.randint(0, args.vocab, (batch, args.model_len + 1), device=device)
            mine = RankBatch(tokens[:, :-1], tokens[:, 1:])

            def step(model=model, mine=mine):
                model.zero_grad(set_to_none=True)
                mine.scored(model)[0].backward()

            calls[f"{name} B{batch} step"] = step
    return calls


def main() -> int:
    args = parse_args()  # first: `--help` answers on any machine
    if not torch.cuda.is_available():
        print("profile_kernels: needs a CUDA GPU", file=sys.stderr)
        return 1
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    syncs(lambda: torch.zeros(1, device="cuda"))  # the debug mode's first use reports a sync of its own
    t0 = time.time()
    for n in (int(s) for s in args.sizes.split(",") if s):
        print(f"\nN = {n}, B 1, H {args.heads}, d {args.dim}, bf16", flush=True)
        for label, fn in freesolo_calls(n, args).items():
            profile_call(label, fn, args.top)
        torch.cuda.empty_cache()
    for n in (int(s) for s in args.rewired.split(",") if s):
        print(f"\nrewired vs flash SDPA, N = {n}", flush=True)
        for label, fn in rewired_calls(n, args).items():
            profile_call(label, fn, args.top)
        torch.cuda.empty_cache()
    if args.models:
        print(f"\ntraining steps, d_model {args.d_model}, {args.layers} layers, {args.heads} heads, "
              f"N = {args.model_len}, vocabulary {args.vocab}, bf16", flush=True)
        for label, fn in model_steps(args).items():
            profile_call(label, fn, args.top)
        torch.cuda.empty_cache()
    print(f"\ntotal {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
