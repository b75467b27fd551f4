"""Time `fsf export` of a recipe's checkpoint (random weights), the way a run writes it.

The tool builds the recipe's model with random weights, wraps it in a DeepSpeed engine at the
recipe's ZeRO stage (one CPU process), writes a checkpoint as the trainer does, then exports it
and prints the wall and CPU time of the export (read + merge, safetensors write, logits proof),
the size of model.safetensors and the proof's largest logit difference.

    python tools/bench_export.py --recipe yamls/tfpp-340m.yaml
    python tools/bench_export.py --recipe yamls/tfpp-340m.yaml --dtype bf16 --zero-stage 3

The recipe's tokenizer file is not needed (the byte tokenizer stands in; the vocabulary keeps
the recipe's size) and no data is read.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch


def write_checkpoint(recipe: str, run_dir: Path, zero_stage: int | None) -> Path:
    """A run directory holding one checkpoint of the recipe's model (random weights)."""
    import deepspeed

    from fsframework.checkpoints.writing import save
    from fsframework.config import load_config, to_yaml
    from fsframework.models.registry import build_model, count_parameters
    from fsframework.parallel.deepspeed_config import deepspeed_config
    from fsframework.parallel.deepspeed_start import import_muon_lazily, skip_shared_memory_allreduce
    from fsframework.parallel.process_group import init_distributed

    overrides = [f"run_dir={run_dir}", "data.tokenizer=byte", "parallel.precision=fp32"]
    if zero_stage is not None:
        overrides.append(f"parallel.zero_stage={zero_stage}")
    cfg = load_config(recipe, overrides)
    init_distributed("gloo")
    torch.manual_seed(0)
    model = build_model(cfg.model)
    print(f"{recipe}: {cfg.model.name}, {count_parameters(model) / 1e6:.1f}M parameters, "
          f"ZeRO stage {cfg.parallel.zero_stage}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr)
    import_muon_lazily()  # as the trainer starts its engine: no inductor load for ZeRO's Muon check,
    skip_shared_memory_allreduce()  # no JIT build of the CPU all-reduce extension (~90 s on a CPU host)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer,
                                      config=deepspeed_config(cfg))
    started = time.perf_counter()
    ckpt = save(engine, run_dir / "checkpoints", 1, {"train_state": {}}, to_yaml(cfg), rank=0, keep=1)
    print(f"checkpoint written in {time.perf_counter() - started:.1f}s: {ckpt}")
    return ckpt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="yamls/tfpp-340m.yaml")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--zero-stage", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory, removed")
    args = parser.parse_args()

    from fsframework.export import export_checkpoint

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-export-"))
    try:
        write_checkpoint(args.recipe, workdir / "run", args.zero_stage)
        wall, cpu = time.perf_counter(), time.process_time()
        result = export_checkpoint(workdir / "run", workdir / "export", dtype=args.dtype, log=print)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        size = (workdir / "export" / "model.safetensors").stat().st_size
        print(f"export ({args.dtype}): {wall:.1f}s wall, {cpu:.1f}s CPU; model.safetensors {size / 2**30:.2f} GiB; "
              f"largest |logit difference| source vs export {result.max_difference:.3g}")
        if result.rounding_drift is not None:
            print(f"largest |logit difference| fp32 source vs {args.dtype} export (rounding): "
                  f"{result.rounding_drift:.3g}")
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
