"""Time and peak memory of a training step with the decoder blocks compiled (`train.compile`).

One training step = forward, the per-token losses the model returns given its targets
(`RankBatch.scored`, the trainer's path), the mean loss, backward, of a model of each `--kinds`
with `--d-model` x `--layers` at batch `--batch` and `--length` tokens (bf16 on a GPU, fp32 on a
CPU). Eager and compiled run side by side, each in a fresh subprocess; the compiled run's first
step (tracing and code generation) is reported apart as `first step s`. Time is the fastest of
`--repeats` steps after that first one; peak memory as in `step_timing.time_steps` (on a CPU the
growth of the process's maximum RSS from before the first step, compilation included).

    python tools/bench_compile.py --kinds tfpp swa fsl --length 1024
    python tools/bench_compile.py --device cuda --kinds tfpp fs fsl --d-model 1024 --layers 4 --length 4096
"""

from __future__ import annotations

import argparse
import json

from step_timing import in_fresh_process, time_steps


def worker(kind: str, compiled: bool, args) -> dict:
    import torch

    from fsframework.config import AttentionConfig, ModelConfig
    from fsframework.models.compile import compile_blocks
    from fsframework.models.registry import build_model
    from fsframework.parallel.batch import RankBatch

    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    torch.manual_seed(0)
    cfg = ModelConfig(name=kind, vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers,
                      n_heads=args.heads, attention=AttentionConfig(impl="auto"))
    model = build_model(cfg).to(args.device, torch.bfloat16 if cuda else torch.float32)
    if compiled:
        compile_blocks(model)
    tokens = torch.randint(0, args.vocab, (args.batch, args.length + 1), device=args.device)
    batch = RankBatch(tokens[:, :-1], tokens[:, 1:])

    def step():
        model.zero_grad(set_to_none=True)
        loss, _ = batch.scored(model)
        loss.backward()

    return time_steps(step, args.repeats, cuda)  # its warm-up step compiles the blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", nargs="+", default=["tfpp", "swa", "fsl"])
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=260)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "COMPILED"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1] == "1", args)))
        return
    print(f"training step, d_model {args.d_model}, {args.layers} layers, batch {args.batch}, N {args.length}, "
          f"{args.device} ({'bf16' if args.device == 'cuda' else 'fp32'}, {args.threads} thread(s))", flush=True)
    print("| kind | eager step s | compiled step s | x eager | first step s | eager peak MiB | compiled peak MiB |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for kind in args.kinds:
        eager, compiled = (in_fresh_process(__file__, [kind, flag], f"{kind} {'compiled' if flag == '1' else 'eager'}")
                           for flag in ("0", "1"))
        rows.append({"kind": kind, "eager": eager, "compiled": compiled})
        print(f"| {kind} | {eager['time_s']:.3f} | {compiled['time_s']:.3f} | "
              f"{compiled['time_s'] / eager['time_s']:.2f} | {compiled['first_s']:.1f} | "
              f"{eager['peak_bytes'] / 2**20:,.0f} | {compiled['peak_bytes'] / 2**20:,.0f} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
