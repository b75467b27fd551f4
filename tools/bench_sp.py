"""Sequence-parallel measurements on CPU ranks (gloo): activation memory, bytes per layer, wall time.

    python tools/bench_sp.py                      # all three tables
    python tools/bench_sp.py --only bytes         # FS bytes per layer at N=32k, sp=2,4,8
    python tools/bench_sp.py --only recompute --kind fs   # activation checkpointing on/off, N=4k and 16k

Prints, per rank:
1. activation memory: bytes of the tensors autograd saves for the backward pass
   (unique storages, counted by a saved-tensors hook), and the process peak RSS,
   for sp = 1, 2, 4 at a fixed N: activations should fall roughly as 1/sp;
2. bytes received per layer per training step (forward + backward), summed over
   the ranks of one SP group, for FS at N = 32768 and sp = 2, 4, 8: counted by
   `CommCounter` on the real collectives, next to the analytic formula
   `2 * sp * (sp - 1) * L * 2 * D * bytes` (L = longest slice, D = H * d);
3. the wall time of one forward + backward at sp = 2 against sp = 1;
4. (--only recompute) activation memory per rank with `train.activation_checkpointing` off and
   on, at N = 4096 and 16384, sp = 1 and 2. With it on, the count adds the inputs that the
   checkpointed blocks keep for their recomputation (a forward pre-hook on each block).
A benchmark measures and prints; the assertions live in tests/parallel.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world: int, spec: dict) -> list[dict]:
    """Run `world` worker ranks of this script; each prints one JSON line of results."""
    port, procs = _free_port(), []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(REPO)}
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(spec)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode:
            raise SystemExit(f"worker failed:\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def worker(spec: dict) -> None:
    import torch
    import torch.distributed as dist

    from fsframework.config import AttentionConfig, ModelConfig, ParallelConfig
    from fsframework.models.registry import build_model
    from fsframework.parallel.collectives import CommCounter
    from fsframework.parallel.parallelize import parallelize, sp_context
    from fsframework.parallel.loss import sequence_parallel_losses
    from fsframework.models.losses import lm_losses

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    sp = dist.get_world_size()
    att = AttentionConfig(window=spec.get("window", 512), block_size=128, cell_size=32, impl="reference")
    cfg = ModelConfig(name=spec["kind"], vocab_size=256, d_model=spec["d_model"], n_layers=spec["layers"],
                      n_heads=spec["heads"], attention=att)
    torch.manual_seed(0)
    model = build_model(cfg)
    blocks = []
    if spec.get("recompute"):
        from fsframework.models.recompute import enable_activation_checkpointing

        enable_activation_checkpointing(model)
        blocks = [model.cell] if hasattr(model, "cell") else list(model.layers)  # what is recomputed
    model = parallelize(model, ParallelConfig(sp=sp))
    tokens = torch.randint(0, 256, (1, spec["n"] + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step():
        logits = model(inputs)
        ctx = sp_context(model)
        loss = sequence_parallel_losses(logits, targets, None, ctx)[0] if ctx else lm_losses(logits, targets)[0]
        loss.backward()

    saved: dict[int, int] = {}
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t):  # activations only: parameters saved for backward are not per-token memory
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:
            saved.setdefault(ptr, t.untyped_storage().nbytes())
        return t

    def keep_inputs(module, args):  # a checkpointed block keeps its tensor inputs until backward
        for t in args:
            if isinstance(t, torch.Tensor):
                pack(t)

    hooks = [block.register_forward_pre_hook(keep_inputs) for block in blocks]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with CommCounter.counting() as counted:
            step()
    for hook in hooks:
        hook.remove()
    times, cpu = [], []
    for _ in range(spec.get("repeats", 2)):
        dist.barrier()
        start, start_cpu = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    print(json.dumps({"rank": dist.get_rank(), "saved_mb": sum(saved.values()) / 2**20,
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "bytes": dict(counted), "time_s": min(times, default=0.0),
                      "cpu_s": min(cpu, default=0.0),
                      "span": list(sp_context(model).span) if sp > 1 else [0, spec["n"]]}))
    dist.destroy_process_group()


def analytic_bytes(n: int, sp: int, block: int, d_model: int, elem: int) -> int:
    """Bytes received per layer and step by all ranks of one SP group (all-gather + reduce-scatter of [K;V])."""
    blocks = -(-n // block)
    longest = -(-blocks // sp) * block
    return 2 * sp * (sp - 1) * longest * 2 * d_model * elem


def memory_table(kind: str, n: int) -> None:
    print(f"\n1. activation memory per rank, {kind}, N={n}, d_model 256, 4 layers, 4 heads, fp32")
    print(f"{'sp':>3} {'rank':>4} {'slice':>13} {'saved MB':>9} {'peak RSS MB':>11}")
    for sp in (1, 2, 4):
        for r in launch(sp, {"kind": kind, "n": n, "d_model": 256, "layers": 4, "heads": 4, "repeats": 1}):
            print(f"{sp:>3} {r['rank']:>4} {str(r['span']):>13} {r['saved_mb']:>9.1f} {r['rss_mb']:>11.0f}")


def bytes_table(n: int = 32768) -> None:
    d_model, heads, layers = 16, 2, 1  # the counted run is narrow; the formula is linear in D
    print(f"\n2. FS bytes received per layer per step (fwd + bwd), N={n}, summed over one SP group")
    print(f"{'sp':>3} {'counted (D=16, fp32)':>21} {'analytic':>12} {'analytic D=1024 bf16':>21} {'per rank':>10}")
    for sp in (2, 4, 8):
        results = launch(sp, {"kind": "fs", "n": n, "d_model": d_model, "layers": layers, "heads": heads,
                              "repeats": 0})
        counted = sum(sum(r["bytes"].values()) for r in results) // layers
        formula = analytic_bytes(n, sp, 128, d_model, 4)
        big = analytic_bytes(n, sp, 128, 1024, 2)
        print(f"{sp:>3} {counted:>21,} {formula:>12,} {big / 1e6:>18.1f} MB {big / sp / 1e6:>7.1f} MB")


def time_table(kind: str, n: int) -> None:
    print(f"\n3. wall time of forward + backward, {kind}, N={n} (1 thread per rank)")
    spec = {"kind": kind, "n": n, "d_model": 256, "layers": 4, "heads": 4, "repeats": 2}
    single = launch(1, spec)
    t1, c1 = single[0]["time_s"], single[0]["cpu_s"]
    ranks = launch(2, spec)
    t2, c2 = max(r["time_s"] for r in ranks), max(r["cpu_s"] for r in ranks)
    # CPU time per rank is the work a rank does; wall time also shows how the ranks share this host's cores
    print(f"wall: sp=1 {t1:.2f} s, sp=2 {t2:.2f} s (slowest rank), ratio sp2/sp1 = {t2 / t1:.2f}")
    print(f"CPU time of the busiest rank: sp=1 {c1:.2f} s, sp=2 {c2:.2f} s, ratio {c2 / c1:.2f}")


def recompute_table(kind: str) -> None:
    print(f"\n4. activation memory per rank, {kind}, d_model 256, 4 layers, 4 heads, fp32: "
          "train.activation_checkpointing off / on")
    print(f"{'N':>6} {'sp':>3} {'rank':>4} {'off MB':>8} {'on MB':>8} {'on/off':>7}")
    for n in (4096, 16384):
        for sp in (1, 2):
            spec = {"kind": kind, "n": n, "d_model": 256, "layers": 4, "heads": 4, "repeats": 0}
            off, on = launch(sp, spec), launch(sp, {**spec, "recompute": True})
            for a, b in zip(off, on):
                print(f"{n:>6} {sp:>3} {a['rank']:>4} {a['saved_mb']:>8.1f} {b['saved_mb']:>8.1f} "
                      f"{b['saved_mb'] / a['saved_mb']:>7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--only", choices=("memory", "bytes", "time", "recompute"))
    parser.add_argument("--kind", default="tfpp")
    parser.add_argument("--n", type=int, default=4096)
    args = parser.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    if args.only in (None, "memory"):
        memory_table(args.kind, args.n)
    if args.only in (None, "bytes"):
        bytes_table()
    if args.only in (None, "time"):
        time_table(args.kind, args.n)
    if args.only == "recompute":
        recompute_table(args.kind)


if __name__ == "__main__":
    main()
