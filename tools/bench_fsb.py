"""FS-B forest search: time and peak memory against FS exact routing, and recall of Eq. 12's top-K.

Part 1, cost (routing only, batch 1, fp32, s=32, B=128, K=4), `--cases` of:
  fs         FS exact routing: Eq. 7 over every eligible cell (`select_cells(variant="fs")`; its
             Triton kernel on a GPU)
  fsb        FS-B: the forests of every block + beam search (Wb=16, c=8) + Eq. 12 rescoring
             (tau per head: the median a_c of the input's cells); the search's kernel on a GPU
  fsb-torch  the same with the search in PyTorch (`impl="reference"`): on a GPU, against `fsb`
On the CPU (default) every case runs PyTorch. Also printed: the aten ops one call dispatches per query
block (host work, the same on every machine; a Triton launch is not one). `--device cuda` times synchronized calls and
reports the peak of allocated GPU memory. Each (case, N) runs in a fresh subprocess; on the
CPU peak memory is the growth of the process's maximum RSS over its value once the inputs
exist; time is the fastest of `--repeats` calls, wall and CPU. The growth exponent is
`log(x_N2 / x_N1) / log(N2 / N1)` over the two longest lengths (1.0 = linear, 2.0 = quadratic).

Part 2, recall: the fraction of Eq. 12's exact top-K cells (brute force over every
eligible cell) that FS-B selects, over all queries past the first block, at beam widths
`--beams`, on two kinds of keys:
  random   q, k i.i.d. N(0, 1)
  needles  random keys, plus `--needles` planted cells per head whose keys point along
           one direction u (same norm scale as the rest, so a_c does not reveal them),
           and queries carrying 2u: the exact top-K holds the needles

    python tools/bench_fsb.py --lengths 2048 8192 32768 --recall-lengths 2048 8192
    python tools/bench_fsb.py --device cuda --cases fsb-torch fsb fs --lengths 16384 65536 --skip-recall
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time

ROUTING = dict(cell_size=32, block_size=128, top_k=4, sigma=4.0, lam=1.0)
CASES = ("fs", "fsb", "fsb-torch")


def _max_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def median_tau(k, cell_size: int):
    """Per head: the (lower) median of a_c over the complete cells of k `[1, N, H, d]`."""
    from fsframework.ops.freesolo_routing import cell_summaries

    _, a = cell_summaries(k, cell_size)  # 1 C H
    return a[0].sort(dim=0).values[(a.shape[1] - 1) // 2]


def worker(case: str, seq: int, heads: int, dim: int, threads: int, repeats: int, device: str = "cpu") -> dict:
    import torch

    from aten_ops import count_aten_ops
    from fsframework.models.freesolo_settings import fs_pair
    from fsframework.ops.freesolo import select_cells

    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)  # GPU work is queued

    def run(q, k):
        if case == "fs":
            return select_cells(q, k, *fs_pair(variant="fs", impl="auto", **ROUTING))
        impl = "reference" if case == "fsb-torch" else "auto"
        tau = median_tau(k, ROUTING["cell_size"])
        return select_cells(q, k, *fs_pair(variant="fsb", tau=tau, impl=impl, **ROUTING))

    run(*(torch.randn(1, 512, heads, dim, generator=gen).to(device) for _ in range(2)))  # warm-up (and compile)
    q, k = (torch.randn(1, seq, heads, dim, generator=gen).to(device) for _ in range(2))
    sync()
    base = torch.cuda.memory_allocated() if cuda else _max_rss_bytes()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    best, best_cpu, peak = math.inf, math.inf, 0
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        run(q, k)
        sync()
        best = min(best, time.perf_counter() - start)
        best_cpu = min(best_cpu, time.process_time() - start_cpu)
        peak = max(peak, (torch.cuda.max_memory_allocated() if cuda else _max_rss_bytes()) - base)
    return {"time_s": best, "cpu_s": best_cpu, "peak_bytes": peak,
            "ops_per_block": count_aten_ops(run, q, k) / max(1, seq // ROUTING["block_size"])}


def _run_case(case, seq, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", case, str(seq), str(args.heads), str(args.head_dim),
           str(args.threads), str(args.repeats), args.device]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{case} at N={seq} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def exact_eq12(q, k, *, cell_size, block_size, top_k, sigma, lam):
    """Eq. 12's top-K over every eligible cell, block by block (`[Q, start]` logits per block)."""
    import torch

    from fsframework.ops.freesolo_routing import cell_summaries, top_k_earliest

    bsz, seq, heads, dim = q.shape
    out = torch.full((bsz, seq, heads, top_k), -1, dtype=torch.long)
    _, a = cell_summaries(k, cell_size)  # Bt C H
    for start in range(block_size, seq, block_size):
        end, num = min(start + block_size, seq), start // cell_size
        logits = torch.einsum("bqhd,bjhd->bqhj", q[:, start:end], k[:, :num * cell_size]) / math.sqrt(dim)
        lse = logits.view(bsz, end - start, heads, num, cell_size).logsumexp(-1)
        pos = torch.arange(start, end, dtype=q.dtype)[:, None]
        centers = (torch.arange(num, dtype=q.dtype) + 0.5) * cell_size
        prior = lam * a[:, :num].transpose(1, 2)[:, None] * torch.erf((pos - centers) / (2 * sigma))[None, :, None]
        out[:, start:end] = top_k_earliest(lse + prior, None, top_k)
    return out


def keys_for(kind: str, seq: int, heads: int, dim: int, needles: int, seed: int = 0):
    import torch

    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, seq, heads, dim, generator=gen), torch.randn(1, seq, heads, dim, generator=gen)
    if kind == "needles":
        s = ROUTING["cell_size"]
        u = torch.nn.functional.normalize(torch.randn(heads, dim, generator=gen), dim=-1)
        for h in range(heads):
            cells = torch.randperm(seq // s - ROUTING["block_size"] // s, generator=gen)[:needles]
            for c in cells.tolist():
                # same norm scale as a random key (about sqrt(d)), pointing mostly along u
                k[0, c * s:(c + 1) * s, h] = 0.9 * math.sqrt(dim) * u[h] + 0.45 * k[0, c * s:(c + 1) * s, h]
            q[0, :, h] += 2.0 * u[h]
    return q, k


def recall_table(args) -> str:
    import torch

    from fsframework.models.freesolo_settings import fs_pair
    from fsframework.ops.freesolo import select_cells

    torch.set_num_threads(args.threads)
    head = f"{'keys':<9}{'N':>7}" + "".join(f"{f'Wb={w}':>9}" for w in args.beams) + f"{'f0@16':>9}{'ftau@16':>9}"
    lines = [f"recall of Eq. 12's exact top-{ROUTING['top_k']} (both forests unless named), "
             f"{args.heads} heads of {args.head_dim}", head, "-" * len(head)]
    for kind in ("random", "needles"):
        for seq in sorted(args.recall_lengths):
            q, k = keys_for(kind, seq, args.heads, args.head_dim, args.needles)
            exact = exact_eq12(q, k, **ROUTING)
            tau = median_tau(k, ROUTING["cell_size"])
            rows = exact[:, ROUTING["block_size"]:]
            total = (rows >= 0).sum().item()

            def recall(cells):
                got = cells[:, ROUTING["block_size"]:]
                hit = ((rows[..., :, None] == got[..., None, :]) & (rows[..., :, None] >= 0)).any(-1).sum().item()
                return hit / total

            values = [recall(select_cells(q, k, *fs_pair(variant="fsb", tau=tau, beam_width=w, **ROUTING)))
                      for w in args.beams]
            values += [recall(select_cells(q, k, *fs_pair(variant="fsb", tau=tau, beam_width=16, forests=f, **ROUTING)))
                       for f in ("f0", "ftau")]
            lines.append(f"{kind:<9}{seq:>7}" + "".join(f"{v:>9.3f}" for v in values))
            print(lines[-1], flush=True)
    return "\n".join(lines)


def _table(title, results, cases, lengths, key, fmt):
    head = f"{'case':<10}" + "".join(f"{f'N={n}':>11}" for n in lengths) + f"{'exponent':>10}"
    lines = [title, head, "-" * len(head)]
    for case in cases:
        vals = [results[case, n][key] for n in lengths]
        exp = math.nan
        if len(lengths) >= 2 and vals[-1] > 0 and vals[-2] > 0:
            exp = math.log(vals[-1] / vals[-2]) / math.log(lengths[-1] / lengths[-2])
        lines.append(f"{case:<10}" + "".join(f"{fmt(x):>11}" for x in vals) + f"{exp:>10.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192, 32768])
    parser.add_argument("--recall-lengths", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--beams", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--needles", type=int, default=8, help="planted cells per head (needle keys)")
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1, help="timed calls per case (the fastest is reported)")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=["fs", "fsb"], help="cost cases")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the cost cases run")
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument("--skip-recall", action="store_true")
    parser.add_argument("--worker", nargs=7, metavar=("CASE", "N", "H", "D", "THREADS", "REPEATS", "DEVICE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        case, *nums, device = args.worker
        print(json.dumps(worker(case, *map(int, nums), device=device)))
        return
    where = "CUDA" if args.device == "cuda" else "CPU"
    print(f"shape [1, N, {args.heads}, {args.head_dim}] fp32, routing only, {where}, {args.threads} thread(s); "
          + ", ".join(f"{k}={v}" for k, v in ROUTING.items()) + "; FS-B Wb=16 c=8 both forests", flush=True)
    if not args.skip_cost:
        lengths = sorted(args.lengths)
        results = {}
        for case in args.cases:
            for seq in lengths:
                results[case, seq] = r = _run_case(case, seq, args)
                print(f"  {case:<9} N={seq:<7} {r['time_s']:8.3f} s wall {r['cpu_s']:8.3f} s cpu "
                      f"{r['peak_bytes'] / 2**20:10.1f} MiB", flush=True)
        print()
        print(_table("wall time (s)", results, args.cases, lengths, "time_s", lambda x: f"{x:.3f}"))
        print()
        print(_table("CPU time (s)", results, args.cases, lengths, "cpu_s", lambda x: f"{x:.3f}"))
        print()
        memory = "peak GPU memory allocated" if args.device == "cuda" else "peak memory"
        memory += " (MiB above inputs)"
        print(_table(memory, results, args.cases, lengths, "peak_bytes", lambda x: f"{x / 2**20:.1f}"))
        print()
        print(_table("aten ops per query block (host work; each a launch on a GPU)", results, args.cases, lengths,
                     "ops_per_block", lambda x: f"{x:.0f}"))
        print()
    if not args.skip_recall:
        print(recall_table(args))


if __name__ == "__main__":
    main()
