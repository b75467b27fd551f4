"""Wall time of batched forward passes against sequence length: AR-GRC (the tree scan)
against Transformers, with growth exponents and a plot (docs/argrc.md §8).

Models come from the registry (`fsframework.models.build_model`), randomly initialised,
in inference mode, fp32. Time is the fastest of `--repeats` forward passes after a
warm-up, as wall time and as process CPU time (steadier on a shared machine). The growth
exponent is the least-squares slope of log(time) against log(N) over all lengths, and the
slope between the two longest (1.0 = linear, 2.0 = quadratic).

    python tools/bench_scan.py --lengths 4096 8192 16384 32768 65536 --plot bench_scan.png

The Transformers' reference attention materialises `N x N` scores: `--transformer-max`
bounds their lengths (default 16384). `--impl triton --device cuda` times the kernel.

Each line also prints the minor page faults of the fastest pass. On CPU they are the part
of the time that is not the model's: glibc maps every buffer over 32 MiB afresh and the
kernel zeroes its pages on first touch, so from the length where a `[B, N, D]` activation
crosses that size, each pass pays for faults it did not pay for at shorter lengths.
`--allocator reuse` keeps freed memory in the process (glibc `mallopt`: no fresh mappings,
no trimming) and so times the model alone (docs/argrc.md §8).
"""

from __future__ import annotations

import argparse
import ctypes
import math
import resource
import time

import torch

from fsframework.config import ArgrcConfig, AttentionConfig, ModelConfig
from fsframework.models import build_model, count_parameters


def models(width: int, vocab: int, impl: str) -> dict[str, ModelConfig]:
    att = AttentionConfig(impl=impl)
    return {
        "argrc": ModelConfig(name="argrc", vocab_size=vocab, d_model=width, tie_embeddings=True,
                             argrc=ArgrcConfig(d_state=width), attention=att),
        "alibi": ModelConfig(name="alibi", vocab_size=vocab, d_model=width, n_layers=3, n_heads=4,
                             tie_embeddings=True, attention=att),
        "sinusoidal": ModelConfig(name="sinusoidal", vocab_size=vocab, d_model=width, n_layers=3, n_heads=4,
                                  tie_embeddings=True, attention=att),
    }


def reuse_freed_memory() -> None:
    """Make glibc's malloc serve every allocation from its heap and never return freed
    memory to the system, so a buffer freed by one pass is reused by the next without
    page faults. Raises on a C library without `mallopt` (not glibc)."""
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallopt"):
        raise SystemExit("--allocator reuse needs glibc's mallopt; this C library has none")
    m_trim_threshold, m_mmap_max = -1, -4  # from glibc's malloc.h
    if not (libc.mallopt(m_mmap_max, 0) and libc.mallopt(m_trim_threshold, 2**31 - 1)):
        raise SystemExit("glibc refused mallopt(M_MMAP_MAX / M_TRIM_THRESHOLD)")


def time_forward(model, tokens: torch.Tensor, repeats: int) -> tuple[float, float, int]:
    """(wall s, process CPU s, minor page faults) of the fastest of `repeats` passes."""
    best, best_cpu, faults = math.inf, math.inf, 0
    with torch.inference_mode():
        for _ in range(repeats):
            if tokens.is_cuda:
                torch.cuda.synchronize()
            start_faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start, start_cpu = time.perf_counter(), time.process_time()
            model(tokens)
            if tokens.is_cuda:
                torch.cuda.synchronize()
            wall = time.perf_counter() - start
            best_cpu = min(best_cpu, time.process_time() - start_cpu)
            if wall < best:
                best, faults = wall, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start_faults
    return best, best_cpu, faults


def exponents(lengths: list[int], times: list[float]) -> tuple[float, float]:
    """(least-squares slope over all points, slope between the last two) in log-log."""
    xs, ys = [math.log(n) for n in lengths], [math.log(t) for t in times]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    fit = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return fit, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768, 65536])
    parser.add_argument("--models", nargs="+", default=["argrc", "alibi"], choices=["argrc", "alibi", "sinusoidal"])
    parser.add_argument("--width", type=int, default=64, help="E = D for AR-GRC, d_model for the Transformers")
    parser.add_argument("--vocab", type=int, default=260)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--transformer-max", type=int, default=16384)
    parser.add_argument("--impl", default="reference", choices=["reference", "triton", "auto"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--allocator", default="system", choices=["system", "reuse"],
                        help="reuse: keep freed memory in the process, no page faults from fresh mappings (glibc)")
    parser.add_argument("--plot", default=None, help="PNG path for time against length (log-log)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.allocator == "reuse":
        reuse_freed_memory()
    lengths = sorted(args.lengths)
    results: dict[str, dict[int, float]] = {}  # wall time
    cpu_results: dict[str, dict[int, float]] = {}
    print(f"batch {args.batch}, width {args.width}, vocab {args.vocab}, fp32 forward, {args.device}, "
          f"impl {args.impl}, {args.threads} thread(s), allocator {args.allocator}")
    for name in args.models:
        torch.manual_seed(0)
        model = build_model(models(args.width, args.vocab, args.impl)[name]).to(args.device).eval()
        own = [n for n in lengths if name == "argrc" or n <= args.transformer_max]
        time_forward(model, torch.randint(0, args.vocab, (args.batch, 512), device=args.device), 1)  # warm-up
        results[name], cpu_results[name] = {}, {}
        for n in own:
            tokens = torch.randint(0, args.vocab, (args.batch, n), device=args.device)
            wall, cpu, faults = time_forward(model, tokens, args.repeats)
            results[name][n], cpu_results[name][n] = wall, cpu
            print(f"{name:10s} ({count_parameters(model) / 1e6:.2f}M)  N={n:6d}  wall {wall:8.3f} s  cpu {cpu:8.3f} s"
                  f"  page faults {faults:7d}", flush=True)
        if len(own) >= 2:
            for label, series in (("wall", results[name]), ("cpu", cpu_results[name])):
                fit, last = exponents(own, [series[n] for n in own])
                print(f"{name:10s} growth exponent of {label} time: {fit:.2f} (fit over {own[0]}..{own[-1]}), "
                      f"{last:.2f} (last two)")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for name, series in results.items():
            ax.loglog(list(series), list(series.values()), marker="o", label=name)
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("forward wall time (s)")
        ax.set_title(f"batched forward, batch {args.batch}, width {args.width}, {args.device}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
