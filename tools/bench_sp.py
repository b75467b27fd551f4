"""Sequence-parallel measurements on CPU ranks (gloo): activation memory, bytes per layer, wall time.

    python tools/bench_sp.py                      # the memory, bytes, work and time tables
    python tools/bench_sp.py --only bytes --kinds fsl fs tfpp --n 8192 32768 131072 --sp 2 4 8 \
        [--layout zigzag] [--json OUT]            # bytes per layer, before (all-gather) and after
    python tools/bench_sp.py --only work --n 32768 --sp 2 4 8   # per-rank causal work, contiguous vs zigzag
    python tools/bench_sp.py --only recompute --kind fs   # activation checkpointing on/off, N=4k and 16k
                                                          # (or the --n given)
    python tools/bench_sp.py --only memory time recompute --kind fs --n 4096 --sp 2   # several tables: the
                                                          # ones that run the model share its runs

Prints, per rank:
1. activation memory: bytes of the tensors autograd saves for the backward pass
   (unique storages, counted by a saved-tensors hook), and the process peak RSS,
   for sp = 1, 2, 4 (1 and `--sp`) at a fixed N: activations should fall roughly as 1/sp;
2. bytes received per layer per training step (forward + backward) and the bytes of
   other ranks' keys and values a rank holds for its attention (the gathered-key
   memory: every storage the fetch leaves alive for the backward, less the own keys and
   values; under zigzag both runs'), per rank maxima, for each kind, N and sp (and the forward
   pass's bytes alone, and how evenly the ranks receive: the maximum over the mean): counted
   by `CommCounter` on the
   real collectives of the kind's `KeySource` (one layer, random keys, H = 4, d = 32,
   fp32, the default attention config), "before" = today's all-gather of the whole
   prefix for every prefix kind, "after" = the kind's own fetch under `--layout`;
   `--json OUT` writes them as a list of records;
5. (--only work) per-rank work of the layouts: causal score elements (TF++, ALiBi,
   sinusoidal, rewired) and FS routing scores (query x eligible cell) counted over the
   runs each rank holds, max / mean across ranks;
3. the wall time of one forward + backward at sp = 2 against sp = 1;
4. (--only recompute) activation memory per rank with `train.activation_checkpointing` off and
   on, at N = 4096 and 16384 (or `--n`), sp = 1 and 2. With it on, the count adds the inputs that the
   checkpointed blocks keep for their recomputation (a forward pre-hook on each block).
A benchmark measures and prints; the assertions live in tests/parallel.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

from launch_ranks import launch as launch_script


def launch(world: int, spec: dict) -> list[dict]:
    """`world` worker ranks of this script (`worker` or `keys_worker` by the spec's mode)."""
    return launch_script(world, spec, __file__)


def worker(spec: dict) -> None:
    import torch
    import torch.distributed as dist

    from fsframework.config import AttentionConfig, ModelConfig, ParallelConfig
    from fsframework.models.registry import build_model
    from fsframework.parallel.collectives import CommCounter
    from fsframework.parallel.batch import shard_batch
    from fsframework.parallel.parallelize import parallelize, sp_context

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
        blocks = model.recomputed_blocks()  # what is recomputed
    model = parallelize(model, ParallelConfig(sp=sp))
    tokens = torch.randint(0, 256, (1, spec["n"] + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step():
        mine = shard_batch(sp_context(model), inputs, targets)
        mine.losses(mine.logits(model))[0].backward()

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
                      "runs": sp_context(model).at_length(spec["n"]).runs if sp > 1 else [(0, spec["n"])]}))
    dist.destroy_process_group()


class ModelRuns:
    """The model workers' ranks (d_model 256, 4 layers, 4 heads), launched once per (sp, kind, N, recompute)
    and shared by the tables that read them: the memory and time tables read the same runs (the saved
    tensors are counted in the first step, the times are those of the `repeats` steps after it), the
    recompute table's "off" column too."""

    def __init__(self, repeats: int):
        self.repeats, self.done = repeats, {}

    def ranks(self, sp: int, kind: str, n: int, recompute: bool = False) -> list[dict]:
        key = (sp, kind, n, recompute)
        if key not in self.done:
            self.done[key] = launch(sp, {"kind": kind, "n": n, "d_model": 256, "layers": 4, "heads": 4,
                                         "repeats": self.repeats, "recompute": recompute})
        return self.done[key]


def memory_table(runs: ModelRuns, kind: str, n: int, sps: list[int]) -> None:
    print(f"\n1. activation memory per rank, {kind}, N={n}, d_model 256, 4 layers, 4 heads, fp32")
    print(f"{'sp':>3} {'rank':>4} {'slice':>13} {'saved MB':>9} {'peak RSS MB':>11}")
    for sp in sps:
        for r in runs.ranks(sp, kind, n):
            slices = "+".join(f"[{s},{e})" for s, e in r["runs"])  # zigzag: two runs per rank
            print(f"{sp:>3} {r['rank']:>4} {slices:>13} {r['saved_mb']:>9.1f} {r['rss_mb']:>11.0f}")


def keys_worker(spec: dict) -> None:
    """One rank of the bytes table: every (kind, N, scheme) of `spec`, one layer's fetch forward + backward."""
    import torch
    import torch.distributed as dist

    from fsframework.config import AttentionConfig
    from fsframework.models.registry import attention_kind
    from fsframework.parallel.attention import SequenceParallelKeys, ZigzagKeys, gather_kv
    from fsframework.parallel.collectives import CommCounter
    from fsframework.parallel.context import SPContext
    from fsframework.parallel.groups import init_groups
    from fsframework.parallel.sharding import shard_runs

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    groups = init_groups(dist.get_world_size())
    att = AttentionConfig()
    records = []
    for kind in spec["kinds"]:
        entry = attention_kind(kind)
        for n in spec["n"]:
            for scheme in ("before", "after"):
                layout = spec["layout"] if scheme == "after" and entry.keys == "prefix" else "contiguous"
                sp = SPContext(groups=groups, block_size=att.block_size, layout=layout).at_length(n)
                gen = torch.Generator().manual_seed(n)
                q, k, v = (shard_runs(torch.randn(1, n, 4, 32, generator=gen), sp.runs).requires_grad_(True)
                           for _ in range(3))
                # a FreeSolo layer routes through its source (FS: from the gathered summaries)
                router = routing_layer(kind, att) if entry.freesolo else None
                with CommCounter.counting() as counted:
                    if scheme == "before":
                        fetched = [gather_kv(k, v, sp)]
                    else:
                        lengths = [e - s for s, e in sp.runs]
                        views = ZigzagKeys(sp).views() if layout == "zigzag" else [SequenceParallelKeys(sp)]
                        span = entry.key_span(att)
                        # a FreeSolo layer's fetch: the keys and values its op reads (FS: the selected
                        # cells and the halo; FS-L: its retained cells), the op's state (PrefixKeys) left out
                        fetched = [view.freesolo_state(0, qp, kp, vp, span, router)[:2] if router else
                                   view.keys(0, kp, vp, span)
                                   for view, qp, kp, vp in zip(views, *(x.split(lengths, 1) for x in (q, k, v)))]
                    forward = sum(counted.values())
                    sum(kk.sum() + vv.sum() for kk, vv in fetched).backward()
                own = 2 * k.numel() * k.element_size()
                # every distinct storage the fetches leave alive (k and v share one where the fetch splits
                # one tensor, SWA's halo concatenates them apart; zigzag: one per run, both kept for the
                # backward), less the own keys and values among them
                held = sum({x.untyped_storage().data_ptr(): x.untyped_storage().nbytes()
                            for pair in fetched for x in pair}.values())
                records.append({"kind": kind, "n": n, "scheme": scheme, "layout": layout,
                                "bytes": sum(counted.values()), "forward": forward, "held": held - own})
                del fetched, k, v
    print(json.dumps({"rank": dist.get_rank(), "records": records}))
    dist.destroy_process_group()


def routing_layer(kind: str, att):
    """A FreeSolo attention layer of `kind` for H = 4 heads of width 32: what routes for the keys."""
    from fsframework.config import ModelConfig
    from fsframework.models.freesolo_attention import FreeSoloAttention

    return FreeSoloAttention(ModelConfig(name=kind, vocab_size=256, d_model=128, n_heads=4, attention=att), 0)


def bytes_table(kinds: list[str], lengths: list[int], sps: list[int], layout: str) -> list[dict]:
    print(f"\n2. bytes received per layer per step (fwd + bwd) and gathered-key memory, per rank maxima; "
          f"H=4, d=32, fp32, one layer; after = --layout {layout}")
    print(f"{'kind':>5} {'N':>7} {'sp':>3} {'layout':>10} {'before MB':>10} {'after MB':>9} {'ratio':>6} "
          f"{'held before MB':>15} {'held after MB':>14} {'after, forward MB':>18} {'after, max/mean':>16}")
    out = []
    for sp in sps:
        ranks = launch(sp, {"mode": "keys", "kinds": kinds, "n": lengths, "layout": layout})
        by_key: dict[tuple, list] = {}
        for r in ranks:
            for rec in r["records"]:
                by_key.setdefault((rec["kind"], rec["n"], rec["scheme"]), []).append(rec)
        for kind in kinds:
            for n in lengths:
                before, after = by_key[kind, n, "before"], by_key[kind, n, "after"]
                b0, b1 = max(r["bytes"] for r in before), max(r["bytes"] for r in after)
                f0, f1 = max(r["forward"] for r in before), max(r["forward"] for r in after)
                h0, h1 = max(r["held"] for r in before), max(r["held"] for r in after)
                mean1 = sum(r["bytes"] for r in after) / len(after)  # how evenly the ranks receive
                lay = after[0]["layout"]
                print(f"{kind:>5} {n:>7} {sp:>3} {lay:>10} {b0 / 1e6:>10.2f} {b1 / 1e6:>9.2f} {b0 / b1:>6.1f} "
                      f"{h0 / 1e6:>15.2f} {h1 / 1e6:>14.2f} {f1 / 1e6:>18.2f} {b1 / mean1:>16.3f}")
                out += [{"kind": kind, "n": n, "sp": sp, "layout": "contiguous", "fetch": "all_gather",
                         "bytes_received_per_layer": b0, "forward_bytes_received_per_layer": f0,
                         "gathered_key_bytes": h0},
                        {"kind": kind, "n": n, "sp": sp, "layout": lay, "fetch": "kind",
                         "bytes_received_per_layer": b1, "forward_bytes_received_per_layer": f1,
                         "gathered_key_bytes": h1, "mean_bytes_received_per_layer": mean1}]
    return out


def routing_work(runs: list[tuple[int, int]], block: int = 128, cell: int = 32) -> int:
    """FS routing scores of `runs`: every query of a block scores each cell complete before the block."""
    return sum((min(b + block, e) - b) * (b // cell) for s, e in runs for b in range(s, e, block))


def work_table(lengths: list[int], sps: list[int]) -> list[dict]:
    from fsframework.parallel.sharding import causal_work, layout_runs

    print("\n5. per-rank work, max / mean across ranks: causal score elements and FS routing scores")
    print(f"{'N':>7} {'sp':>3} {'causal contiguous':>18} {'causal zigzag':>14} {'FS contiguous':>14} {'FS zigzag':>10}")
    out = []
    for n in lengths:
        for sp in sps:
            row = {}
            for layout in ("contiguous", "zigzag"):
                runs = layout_runs(n, sp, 128, layout)
                for name, count in (("causal", causal_work), ("fs_routing", routing_work)):
                    work = [count(r) for r in runs]
                    row[name, layout] = max(work) / (sum(work) / len(work))
                    out.append({"n": n, "sp": sp, "layout": layout, "work": name, "max_over_mean": row[name, layout]})
            print(f"{n:>7} {sp:>3} {row['causal', 'contiguous']:>18.3f} {row['causal', 'zigzag']:>14.3f} "
                  f"{row['fs_routing', 'contiguous']:>14.3f} {row['fs_routing', 'zigzag']:>10.3f}")
    return out


def time_table(runs: ModelRuns, kind: str, n: int) -> None:
    print(f"\n3. wall time of forward + backward, {kind}, N={n} (1 thread per rank)")
    single = runs.ranks(1, kind, n)
    t1, c1 = single[0]["time_s"], single[0]["cpu_s"]
    ranks = runs.ranks(2, kind, n)
    t2, c2 = max(r["time_s"] for r in ranks), max(r["cpu_s"] for r in ranks)
    # CPU time per rank is the work a rank does; wall time also shows how the ranks share this host's cores
    print(f"wall: sp=1 {t1:.2f} s, sp=2 {t2:.2f} s (slowest rank), ratio sp2/sp1 = {t2 / t1:.2f}")
    print(f"CPU time of the busiest rank: sp=1 {c1:.2f} s, sp=2 {c2:.2f} s, ratio {c2 / c1:.2f}")


def recompute_table(runs: ModelRuns, kind: str, lengths: list[int]) -> None:
    print(f"\n4. activation memory per rank, {kind}, d_model 256, 4 layers, 4 heads, fp32: "
          "train.activation_checkpointing off / on")
    print(f"{'N':>6} {'sp':>3} {'rank':>4} {'off MB':>8} {'on MB':>8} {'on/off':>7}")
    for n in lengths:
        for sp in (1, 2):
            off, on = runs.ranks(sp, kind, n), runs.ranks(sp, kind, n, recompute=True)
            for a, b in zip(off, on):
                print(f"{n:>6} {sp:>3} {a['rank']:>4} {a['saved_mb']:>8.1f} {b['saved_mb']:>8.1f} "
                      f"{b['saved_mb'] / a['saved_mb']:>7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--only", nargs="+", choices=("memory", "bytes", "work", "time", "recompute"),
                        help="these tables (default: memory, bytes, work and time)")
    parser.add_argument("--kind", default="tfpp")
    parser.add_argument("--kinds", nargs="+", default=["fsl", "fs", "tfpp"])
    parser.add_argument("--n", type=int, nargs="+",
                        help="sequence lengths (memory and time take the first; recompute every one)")
    parser.add_argument("--sp", type=int, nargs="+",
                        help="sequence-parallel sizes of the bytes and work tables (default 2 4 8) and of the memory "
                             "table besides sp = 1 (default 2 4)")
    parser.add_argument("--layout", choices=("contiguous", "zigzag"), default="contiguous")
    parser.add_argument("--json", help="write the bytes and work records to this file")
    args = parser.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        return keys_worker(spec) if spec.get("mode") == "keys" else worker(spec)
    n = args.n[0] if args.n else 4096
    tables = args.only or ["memory", "bytes", "work", "time"]
    # the time table times 2 steps after the counted one; memory and recompute need the counted step only
    runs, records = ModelRuns(repeats=2 if "time" in tables else 0), []
    if "memory" in tables:
        memory_table(runs, args.kind, n, [1, *(args.sp or [2, 4])])
    if "bytes" in tables:
        records += bytes_table(args.kinds, args.n or [8192, 32768, 131072], args.sp or [2, 4, 8],
                               args.layout)
    if "work" in tables:
        records += work_table(args.n or [32768], args.sp or [2, 4, 8])
    if "time" in tables:
        time_table(runs, args.kind, n)
    if "recompute" in tables:
        recompute_table(runs, args.kind, args.n or [4096, 16384])
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
