"""Training-step throughput and peak memory of runway-rewired attention against plain attention.

One training step = forward, next-token loss, backward, of a whole model
(`model.name=tfpp` against `model.name=rewired`, same sizes, batch 1). On a CPU the
rewired model runs the PyTorch reference (`fsframework.ops.rewired`); on a GPU
(`--device cuda`) it runs the Triton kernel (impl=auto) in bf16 and plain attention
runs PyTorch's fused SDPA. The table reports tokens per second, the rewired model's
step-time overhead (`time_rewired / time_plain - 1`) and peak memory.

Each (kind, N) runs in a fresh subprocess. Peak memory on a CPU is the growth of the
process's maximum RSS over its value once the model and inputs exist (the warm-up step
included); on a GPU it is `torch.cuda.max_memory_allocated`. Time is the fastest of
`--repeats` steps after one warm-up step.

    python tools/bench_rewired.py --lengths 1024 2048 4096 8192
    python tools/bench_rewired.py --device cuda --d-model 1024 --layers 4 --heads 16
"""

from __future__ import annotations

import argparse
import json

from step_timing import in_fresh_process, time_steps

KINDS = ("tfpp", "rewired")


def worker(kind: str, seq: int, args) -> dict:
    import torch

    from fsframework.config import AttentionConfig, ModelConfig, RewiredConfig
    from fsframework.models.losses import lm_losses
    from fsframework.models.registry import build_model

    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    torch.manual_seed(0)
    attention = AttentionConfig(impl="auto", rewired=RewiredConfig(runway=args.runway))
    cfg = ModelConfig(name=kind, vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers,
                      n_heads=args.heads, attention=attention)
    model = build_model(cfg).to(args.device, torch.bfloat16 if cuda else torch.float32)
    tokens = torch.randint(0, args.vocab, (1, seq + 1), device=args.device)

    def step():
        model.zero_grad(set_to_none=True)
        loss, _ = lm_losses(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()

    return time_steps(step, args.repeats, cuda)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=260)
    parser.add_argument("--runway", default="last", choices=("last", "mean"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args)))
        return
    print(f"training step, batch 1, d_model {args.d_model}, {args.layers} layers, {args.heads} heads, "
          f"{args.device} ({'bf16, Triton kernel' if args.device == 'cuda' else 'fp32, reference'}, "
          f"{args.threads} thread(s)), runway {args.runway}", flush=True)
    results = {(kind, n): in_fresh_process(__file__, [kind, str(n)], f"{kind} at N={n}")
               for n in sorted(args.lengths) for kind in KINDS}
    print("| N | plain tok/s | rewired tok/s | step-time overhead | plain peak MiB | rewired peak MiB |")
    print("|---|---|---|---|---|---|")
    for n in sorted(args.lengths):
        plain, rew = results["tfpp", n], results["rewired", n]
        print(f"| {n} | {n / plain['time_s']:,.0f} | {n / rew['time_s']:,.0f} | "
              f"{rew['time_s'] / plain['time_s'] - 1:+.0%} | {plain['peak_bytes'] / 2**20:,.1f} | "
              f"{rew['peak_bytes'] / 2**20:,.1f} |", flush=True)


if __name__ == "__main__":
    main()
