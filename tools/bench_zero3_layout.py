"""ZeRO-3 parameter gathers per training step under the sequence-parallel layouts, counted on CPU ranks.

    python tools/bench_zero3_layout.py                       # tfpp and fs, sp 2, N 2048
    python tools/bench_zero3_layout.py --kinds tfpp --sp 2 4 --n 4096
    python tools/bench_zero3_layout.py --settings tight     # only DeepSpeed's settings that release every call

Under `parallel.sp_layout=zigzag` every attention module runs once per run of its rank
(`fsframework.parallel.attention.ZigzagRunsSource.runs`), so its projections are called twice per
layer and step. Under ZeRO-3 a partitioned parameter is all-gathered before a module's call
and may be released after it, so two calls could gather it twice. This counts, per rank, the
parameter elements DeepSpeed's ZeRO-3 coordinator all-gathers in one training step (forward
and backward, the third step, after DeepSpeed has traced the module order) and the number of
gather calls, for the contiguous layout, the zigzag layout as fsframework configures it (its
attention modules ZeRO-3 leaves, `parallel/deepspeed_config.py`) and zigzag without leaves,
side by side (d_model 512 unless `--d-model`, 8 heads,
2 layers, fp32, DeepSpeed's default `stage3_param_persistence_threshold`, so every projection
is partitioned). Printed: per-rank maxima and their ratio to contiguous.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

from launch_ranks import launch

# DeepSpeed's defaults keep a parameter gathered while it is reused within 1e9 elements (and up to 1e9
# live): a model below that is gathered once per step whatever the layout. "tight" releases every
# parameter after each call and prefetches nothing, what a model far larger than those limits sees.
# the zigzag layout as fsframework runs it (its attention modules ZeRO-3 leaves, deepspeed_config) and without
LAYOUTS = (("contiguous", True), ("zigzag", True), ("zigzag", False))
SETTINGS = {"default": {},
            "tight": {"stage3_max_live_parameters": 0, "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0}}


def worker(spec: dict) -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import torch
    import torch.distributed as dist
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    from fsframework.config import AttentionConfig, ModelConfig, ParallelConfig
    from fsframework.models.registry import build_model
    from fsframework.parallel.batch import shard_batch
    from fsframework.parallel.deepspeed_config import zero3_leaf_classes
    from fsframework.parallel.deepspeed_start import import_muon_lazily, skip_shared_memory_allreduce
    from fsframework.parallel.parallelize import parallelize, sp_context

    counted = {"elements": 0, "calls": 0}
    gather = PartitionedParameterCoordinator._PartitionedParameterCoordinator__all_gather_params_

    def counting(self, params, forward, quantize=False):
        todo = [p for p in params if p.ds_status == ZeroParamStatus.NOT_AVAILABLE]
        counted["elements"] += sum(p.ds_numel for p in todo)
        counted["calls"] += bool(todo)
        return gather(self, params, forward, quantize)

    PartitionedParameterCoordinator._PartitionedParameterCoordinator__all_gather_params_ = counting
    # before DeepSpeed's backend starts: it would build (or wait for another process's build of) its
    # shared-memory all-reduce, a minute of C++ that nothing here uses
    skip_shared_memory_allreduce()
    deepspeed.init_distributed("gloo")
    torch.set_num_threads(1)
    sp = dist.get_world_size()
    records = []
    settings = {name: SETTINGS[name] for name in spec.get("settings", SETTINGS)}
    for (setting, zero), kind, (layout, leaf) in itertools.product(settings.items(), spec["kinds"], LAYOUTS):
        att = AttentionConfig(window=256, block_size=128, cell_size=32, impl="reference")
        cfg = ModelConfig(name=kind, vocab_size=256, d_model=spec.get("d_model", 512), n_layers=2, n_heads=8,
                          attention=att)
        torch.manual_seed(0)
        model = parallelize(build_model(cfg), ParallelConfig(sp=sp, sp_layout=layout))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        import_muon_lazily()
        leaves = {"leaf_module": {"classes": zero3_leaf_classes(model)}} if leaf else {}
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config={
            "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, **zero, **leaves},
            "zero_allow_untested_optimizer": True, "steps_per_print": 10**12})
        tokens = torch.randint(0, 256, (1, spec["n"] + 1), generator=torch.Generator().manual_seed(1))
        for step in range(3):
            counted.update(elements=0, calls=0)
            mine = shard_batch(sp_context(model), tokens[:, :-1], tokens[:, 1:])
            engine.backward(mine.losses(mine.logits(engine))[0])
            engine.step()
        records.append({"kind": kind, "layout": layout + ("" if leaf else " without leaves"), "setting": setting, "sp": sp, "n": spec["n"], **counted,
                        "params": sum(p.ds_numel for p in model.parameters())})
        engine.destroy()
    print(json.dumps({"rank": dist.get_rank(), "records": records}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--kinds", nargs="+", default=["tfpp", "fs"])
    parser.add_argument("--sp", type=int, nargs="+", default=[2])
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--d-model", type=int, default=512,
                        help="the models' width (8 heads); under 317 the projections stay below DeepSpeed's default "
                             "persistence threshold (1e5 elements) and are never gathered")
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS),
                        help="DeepSpeed's ZeRO-3 settings to count under (comments at SETTINGS)")
    parser.add_argument("--json", help="write the per-rank records to this file")
    args = parser.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    print("ZeRO-3 parameter elements all-gathered per rank in one training step (the third), per-rank maxima; "
          "zigzag as fsframework runs it (attention modules ZeRO-3 leaves) and without leaves")
    names = [layout + ("" if leaf else " without leaves") for layout, leaf in LAYOUTS]
    print(f"{'kind':>5} {'setting':>8} {'sp':>3} {'N':>6} {'params':>9} " + " ".join(f"{n:>24}" for n in names)
          + "  calls (same order)")
    records = []
    for sp in args.sp:
        ranks = launch(sp, {"kinds": args.kinds, "n": args.n, "settings": args.settings, "d_model": args.d_model},
                       __file__)
        records += [r for rank in ranks for r in rank["records"]]
        for setting, kind in itertools.product(args.settings, args.kinds):
            rows = [[r for r in records if (r["kind"], r["layout"], r["setting"], r["sp"]) == (kind, name, setting, sp)]
                    for name in names]
            elements = [max(r["elements"] for r in row) for row in rows]
            calls = [max(r["calls"] for r in row) for row in rows]
            print(f"{kind:>5} {setting:>8} {sp:>3} {args.n:>6} {rows[0][0]['params']:>9} "
                  + " ".join(f"{e:>13} ({e / elements[0]:.2f}x)".rjust(24) for e in elements)
                  + "  " + "/".join(map(str, calls)))
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))

if __name__ == "__main__":
    sys.exit(main())
