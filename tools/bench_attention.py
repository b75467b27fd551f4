"""Forward+backward wall time and peak memory of the attention ops on CPU.

Cases (one attention op, no projections, batch 1, fp32, reference ops):
  dense   causal softmax attention (torch SDPA)
  swa     sliding-window attention with RoPE, window 512 (FreeSolo's local branch)
  swa-fused  the same through PyTorch's fused attention (`impl="auto"` on the CPU)
  fs-lr   FreeSolo long-range branch only, FS (s=32, B=128, K=4)
  fsl-lr  FreeSolo long-range branch only, FS-L (s=32, B=128, K=4, P=64, W=8)
  fs      local + long-range branch (the whole FreeSolo attention op), FS
  fsl     local + long-range branch, FS-L

Each (case, N) runs in a fresh subprocess: peak memory is the growth of the
process's maximum RSS (`getrusage`) over its value after the inputs exist, so
allocator caches of earlier cases cannot hide or inflate it. Time is the
fastest of `--repeats` forward+backward passes after a small warm-up, as wall
time and as the process's CPU time (steadier on a shared machine).
The growth exponent is `log(x_N2 / x_N1) / log(N2 / N1)` over the two longest
lengths (1.0 = linear, 2.0 = quadratic).

    python tools/bench_attention.py --lengths 2048 8192 32768 --heads 4
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time

CASES = ("dense", "swa", "swa-fused", "fs-lr", "fsl-lr", "fs", "fsl")
WINDOW = 512
FREESOLO = dict(cell_size=32, block_size=128, top_k=4, sigma=4.0, lam=1.0, recent_cells=8, retained_cells=64)


def _op(case: str):
    import torch.nn.functional as F

    from fsframework.models.freesolo_settings import fs_pair
    from fsframework.ops.freesolo import long_range_attention
    from fsframework.ops.local_attention import sliding_window_attention

    def dense(q, k, v):  # B T H D -> B H T D for SDPA
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=True).transpose(1, 2)

    def swa(q, k, v):
        return sliding_window_attention(q, k, v, window=WINDOW, impl="reference")

    def swa_fused(q, k, v):
        return sliding_window_attention(q, k, v, window=WINDOW, impl="auto")

    def long_range(variant):
        config, prior = fs_pair(variant=variant, impl="reference", **FREESOLO)
        return lambda q, k, v: long_range_attention(q, k, v, config, prior)

    def both(variant):
        lr = long_range(variant)
        return lambda q, k, v: swa(q, k, v) + lr(q, k, v)

    return {"dense": dense, "swa": swa, "swa-fused": swa_fused, "fs-lr": long_range("fs"), "fsl-lr": long_range("fsl"),
            "fs": both("fs"), "fsl": both("fsl")}[case]


def _max_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def worker(case: str, seq: int, heads: int, dim: int, threads: int, repeats: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    op = _op(case)
    gen = torch.Generator().manual_seed(0)

    def inputs(n):
        q, k, v = (torch.randn(1, n, heads, dim, generator=gen).requires_grad_() for _ in range(3))
        return q, k, v, torch.randn(1, n, heads, dim, generator=gen)

    q, k, v, grad = inputs(512)
    op(q, k, v).backward(grad)  # warm-up: load kernels and code paths at a small size
    q, k, v, grad = inputs(seq)
    base = _max_rss_bytes()
    best, best_cpu, peak = math.inf, math.inf, 0
    for _ in range(repeats):
        q.grad = k.grad = v.grad = None
        start, start_cpu = time.perf_counter(), time.process_time()
        op(q, k, v).backward(grad)
        best = min(best, time.perf_counter() - start)
        best_cpu = min(best_cpu, time.process_time() - start_cpu)
        peak = max(peak, _max_rss_bytes() - base)
    return {"time_s": best, "cpu_s": best_cpu, "peak_bytes": peak}


def _run_case(case, seq, args) -> dict:
    # the same number of passes at every length: a single pass at the largest N would include
    # first-touch page faults that the smaller sizes' best-of-n hides, biasing the exponent
    repeats = args.repeats
    cmd = [sys.executable, __file__, "--worker", case, str(seq), str(args.heads), str(args.head_dim),
           str(args.threads), str(repeats)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{case} at N={seq} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _table(title, results, lengths, cases, key, fmt):
    head = f"{'case':<8}" + "".join(f"{f'N={n}':>11}" for n in lengths)
    head += "".join(f"{f'/dense@{n}':>13}" for n in lengths) + f"{'exponent':>10}"
    lines = [title, head, "-" * len(head)]
    for case in cases:
        vals = [results[case, n][key] for n in lengths]
        dense = [results["dense", n][key] if ("dense", n) in results else math.nan for n in lengths]
        row = f"{case:<8}" + "".join(f"{fmt(x):>11}" for x in vals)
        row += "".join(f"{(x / d if d > 0 else math.nan):>13.3f}" for x, d in zip(vals, dense))
        exp = math.nan
        if len(lengths) >= 2 and vals[-1] > 0 and vals[-2] > 0:
            exp = math.log(vals[-1] / vals[-2]) / math.log(lengths[-1] / lengths[-2])
        lines.append(row + f"{exp:>10.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192, 32768])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    # one thread by default: timings on a shared machine are stable only when no thread waits for a core
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2, help="timed passes per case (the fastest is reported)")
    parser.add_argument("--worker", nargs=6, metavar=("CASE", "N", "H", "D", "THREADS", "REPEATS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        case, *nums = args.worker
        print(json.dumps(worker(case, *map(int, nums))))
        return
    lengths = sorted(args.lengths)
    cases = args.cases if "dense" in args.cases else ["dense", *args.cases]
    print(f"shape [1, N, {args.heads}, {args.head_dim}] fp32, forward+backward, CPU, {args.threads} thread(s); "
          f"window {WINDOW}; FreeSolo " + ", ".join(f"{k}={v}" for k, v in FREESOLO.items()), flush=True)
    results = {}
    for case in cases:
        for seq in lengths:
            results[case, seq] = _run_case(case, seq, args)
            r = results[case, seq]
            print(f"  {case:<7} N={seq:<7} {r['time_s']:8.3f} s wall {r['cpu_s']:8.3f} s cpu "
                  f"{r['peak_bytes'] / 2**20:10.1f} MiB", flush=True)
    print()
    print(_table("wall time (s)", results, lengths, cases, "time_s", lambda x: f"{x:.3f}"))
    print()
    print(_table("CPU time (s)", results, lengths, cases, "cpu_s", lambda x: f"{x:.3f}"))
    print()
    print(_table("peak memory (MiB above inputs)", results, lengths, cases, "peak_bytes",
                 lambda x: f"{x / 2**20:.1f}"))


if __name__ == "__main__":
    main()
