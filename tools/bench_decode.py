"""Streaming decode on the CPU (or `--device cuda`): the decode cache's allocated bytes, decoding
speed and prefill time against the context length, per model kind (docs/decoding.md).

No checkpoint: random weights of the model of `yamls/quickstart.yaml` (or `--config`), with
`model.name` set to each of `--models` (and any dotted `overrides`); or, with `--d-model`, a model
of that width, `--layers` and `--heads` with the papers' attention defaults, built without the
YAML reader (a GPU machine with torch alone: tools/gpu_check.sh step 8). For each (model,
context): a random prompt of `context` tokens is prefilled through the cache (in chunks),
then `--new-tokens` tokens are decoded greedily, one forward pass each.

  cache_bytes    what the cache has allocated after the prefill and the decode (capacity, as
                 in the FreeSolo paper's Table 15): FS-L and SWA flat in the context, TF++ linear
  tokens_per_s   decoded tokens per second (after the prefill); the table also prints them
                 per second of the process's CPU time, steadier on a shared machine
  prefill_s      the prompt's prefill
  ops_per_token  (--count-ops) aten ops one decoded token dispatches, counted with a dispatch mode
                 on a second cache (under no_grad: inference mode hides ops from Python modes);
                 machine-independent, so a change to a cache or an op is compared exactly
  launches_per_token  (--count-ops) those of them that compute (not views, which only relabel
                 memory): each a kernel launch on a GPU, where decoding is launch-bound

    python tools/bench_decode.py --models fsl tfpp --contexts 4096 16384 65536 --json decode.json
    python tools/bench_decode.py --models all --contexts 4096 16384 65536 --new-tokens 16

`--models all` is every registry kind. FS-B (both forests) takes its per-head thresholds from
the random model itself, as `fsf calibrate` would (the lower median of `a_c` over one random
window of `--calibration-tokens`), since random weights have no calibration file.

`--impls` runs each model under each `model.attention.impl` (default: the config's own; with `--d-model`,
"auto"): `--impls reference auto` on a GPU measures the kernels against the PyTorch ops side by side, in
one process (FS-B with every op in PyTorch against the kernels, its search's among them: tools/gpu_check.sh
step 9).

`--json` writes one JSON list of {"model", "impl", "context", "cache_bytes", "tokens_per_s", "prefill_s"}
(and "ops_per_token", "launches_per_token" with `--count-ops`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def measure(model, context: int, new_tokens: int, seed: int) -> dict:
    import torch

    from fsframework.models.decode_cache import cache_bytes, decode_cache, prefill

    device = model.lm_head.weight.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)  # GPU work is queued
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.cfg.vocab_size, (1, context), generator=gen).to(device)
    with torch.inference_mode(), decode_cache(model) as cache:
        sync()
        begin = time.perf_counter()
        hidden = prefill(cache, prompt)
        sync()
        prefill_s = time.perf_counter() - begin
        token = model.lm_head(hidden).argmax(dim=-1)
        sync()
        begin, begin_cpu = time.perf_counter(), time.process_time()
        for _ in range(new_tokens):
            token = model.lm_head(prefill(cache, token[:, None])).argmax(dim=-1)
        sync()
        decode_s, decode_cpu_s = time.perf_counter() - begin, time.process_time() - begin_cpu
        # the CPU-time rate is printed beside the wall-clock one: steadier on a shared machine
        return {"context": context, "cache_bytes": cache_bytes(cache), "tokens_per_s": new_tokens / decode_s,
                "prefill_s": prefill_s, "tokens_per_cpu_s": new_tokens / decode_cpu_s}


def ops_per_token(model, context: int, seed: int) -> tuple[int, int]:
    """Aten ops dispatched by one decoded token after a prompt of `context` tokens (and one token more),
    and how many of them compute: not a view (every output aliasing an input, or `_unsafe_view`), not an
    op that returns no tensor (a dtype promotion)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from fsframework.models.decode_cache import decode_cache, prefill

    class Count(TorchDispatchMode):
        ops = launches = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            returns = func._schema.returns
            view = returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)
            tensors = any(isinstance(r.type, torch.TensorType) or (isinstance(r.type, torch.ListType) and isinstance(
                r.type.getElementType(), torch.TensorType)) for r in returns)  # not promote_types & co
            if tensors and not view and func.overloadpacket is not torch.ops.aten._unsafe_view:
                self.launches += 1
            return func(*args, **(kwargs or {}))

    prompt = torch.randint(0, model.cfg.vocab_size, (1, context + 2), generator=torch.Generator().manual_seed(seed))
    prompt = prompt.to(model.lm_head.weight.device)
    with torch.no_grad(), decode_cache(model) as cache:
        prefill(cache, prompt[:, :context + 1])
        with Count() as count:
            prefill(cache, prompt[:, context + 1:])
    return count.ops, count.launches


def calibrate_on_random_tokens(model, tokens: int, seed: int) -> None:
    """FS-B thresholds for random weights: the lower median of every layer and head's `a_c` over one
    random window (`fsframework.eval.calibrate`'s statistic, without a checkpoint or data), recorded
    from the same weights read as FS (FS-B cannot run before it has thresholds)."""
    import torch

    from fsframework.eval.calibrate import KeyNormRecorder, lower_median
    from fsframework.models.freesolo_attention import freesolo_layers, set_fsb_thresholds
    from fsframework.models.registry import build_model

    as_fs = build_model(dataclasses.replace(model.cfg, name="fs")).eval()
    as_fs.load_state_dict(model.state_dict())
    recorder = KeyNormRecorder(freesolo_layers(as_fs), model.cfg.attention.cell_size)
    window = torch.randint(0, model.cfg.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(seed))
    try:
        with torch.inference_mode():
            as_fs(window)
    finally:
        values = recorder.close()
    set_fsb_thresholds(model, [lower_median(v).tolist() for v in values], source="random-window calibration")


def model_config(args, name: str):
    """The benchmarked model's config: `--config` (+ overrides) read through the YAML reader, or, with
    `--d-model`, built directly (the attention's defaults are the papers' settings)."""
    if args.d_model is None:
        from fsframework.config import load_config

        return load_config(args.config, [*args.overrides, f"model.name={name}"]).model
    from fsframework.config import AttentionConfig, ModelConfig

    if args.overrides:
        raise ValueError("overrides apply to --config; with --d-model the model is --layers x --heads")
    return ModelConfig(name=name, vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers,
                       n_heads=args.heads, attention=AttentionConfig(impl="auto"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["fsl", "tfpp"], help="registry kinds, or all")
    parser.add_argument("--contexts", nargs="+", type=int, default=[4096, 8192, 16384, 32768, 65536])
    parser.add_argument("--config", default=str(REPO / "yamls" / "quickstart.yaml"),
                        help="a job YAML whose model is benchmarked (random weights)")
    parser.add_argument("--d-model", type=int, default=None,
                        help="instead of --config: a model of this width with the papers' attention defaults "
                             "(no YAML reader needed, as on a GPU machine with torch alone); with --layers, --heads")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens decoded after each prefill")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calibration-tokens", type=int, default=2048,
                        help="FS-B: the random window its thresholds are taken from")
    parser.add_argument("--count-ops", action="store_true",
                        help="also count the aten ops of one decoded token (a second prefill per row)")
    parser.add_argument("--impls", nargs="+", default=None, choices=("reference", "triton", "auto"),
                        help="model.attention.impl values to run each model under, side by side")
    parser.add_argument("--json", default=None, help="write the rows to this JSON file")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. model.n_layers=2")
    args = parser.parse_args(argv)
    if args.new_tokens < 1 or min(args.contexts) < 1:
        parser.error("--new-tokens and --contexts must be >= 1")

    import torch

    from fsframework.models.registry import MODEL_NAMES, build_model

    models = list(MODEL_NAMES) if "all" in args.models else args.models
    torch.set_num_threads(args.threads)
    rows = []
    print(f"{'model':>10} {'impl':>9} {'context':>8} {'cache MiB':>10} {'tokens/s':>9} {'tokens/cpu-s':>13} "
          f"{'prefill s':>10}" + (f" {'ops/token':>10} {'launches/token':>15}" if args.count_ops else ""))
    for name in models:
        try:
            base_cfg = model_config(args, name)
        except ValueError as exc:  # ConfigError is a ValueError
            print(f"error: {exc}", file=sys.stderr)
            return 2
        for impl in args.impls or [base_cfg.attention.impl]:
            model_cfg = dataclasses.replace(base_cfg, attention=dataclasses.replace(base_cfg.attention, impl=impl))
            torch.manual_seed(args.seed)  # the same weights under every impl
            model = build_model(model_cfg).to(args.device).eval()
            if name == "fsb" and model_cfg.attention.fsb.forests != "f0":
                calibrate_on_random_tokens(model, args.calibration_tokens, args.seed)
            for context in args.contexts:
                row = {"model": name, "impl": impl, **measure(model, context, args.new_tokens, args.seed)}
                cpu_rate = row.pop("tokens_per_cpu_s")
                if args.count_ops:
                    row["ops_per_token"], row["launches_per_token"] = ops_per_token(model, context, args.seed)
                rows.append(row)
                print(f"{name:>10} {impl:>9} {context:>8} {row['cache_bytes'] / 2**20:>10.3f} "
                      f"{row['tokens_per_s']:>9.1f} {cpu_rate:>13.1f} {row['prefill_s']:>10.2f}"
                      + (f" {row['ops_per_token']:>10} {row['launches_per_token']:>15}" if args.count_ops else ""),
                      flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
