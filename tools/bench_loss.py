"""Peak memory and time of a training step with the output head in chunks (`train.loss_chunk`).

One training step = forward, the per-token losses the model returns given its targets
(`RankBatch.scored`, the trainer's path), the mean loss, backward, of a Transformer++ of
`--d-model` x `--layers` at batch `--batch`. Each (vocabulary, length, loss_chunk) runs in a fresh
subprocess; peak memory on a CPU is the growth of the process's maximum RSS over its value once
the model and inputs exist (the warm-up step included, gradients too), on a GPU
`torch.cuda.max_memory_allocated` (bf16 there, fp32 on a CPU). Time is the fastest of
`--repeats` steps after a warm-up step. Chunk 0 is the whole `[B, T, V]` logits at once; the
table gives each chunk's step time and memory beside it.

    python tools/bench_loss.py --vocab 32000 128256 --lengths 4096 --chunks 0 2048 512
    python tools/bench_loss.py --device cuda --batch 8 --d-model 1024 --layers 4
"""

from __future__ import annotations

import argparse
import json

from step_timing import in_fresh_process, time_steps


def worker(vocab: int, seq: int, chunk: int, args) -> dict:
    import torch

    from fsframework.config import ModelConfig
    from fsframework.models.registry import build_model
    from fsframework.parallel.batch import RankBatch

    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    torch.manual_seed(0)
    cfg = ModelConfig(name="tfpp", vocab_size=vocab, d_model=args.d_model, n_layers=args.layers,
                      n_heads=args.heads)
    model = build_model(cfg).to(args.device, torch.bfloat16 if cuda else torch.float32)
    tokens = torch.randint(0, vocab, (args.batch, seq + 1), device=args.device)
    batch = RankBatch(tokens[:, :-1], tokens[:, 1:])

    def step():
        model.zero_grad(set_to_none=True)
        loss, _ = batch.scored(model, chunk)
        loss.backward()

    return time_steps(step, args.repeats, cuda)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 128256])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096])
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 2048, 512])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--worker", nargs=3, type=int, metavar=("VOCAB", "N", "CHUNK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker, args)))
        return
    print(f"training step, Transformer++ d_model {args.d_model}, {args.layers} layers, batch {args.batch}, "
          f"{args.device} ({'bf16' if args.device == 'cuda' else 'fp32'}, {args.threads} thread(s))", flush=True)
    print("| vocabulary | N | loss_chunk | step s | x whole | peak MiB | x whole |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for vocab in args.vocab:
        for n in args.lengths:
            whole = None
            for chunk in args.chunks:
                r = in_fresh_process(__file__, [str(vocab), str(n), str(chunk)],
                                     f"vocabulary {vocab}, N={n}, loss_chunk {chunk}")
                whole = whole or r
                rows.append({"vocab": vocab, "n": n, "loss_chunk": chunk, **r})
                print(f"| {vocab:,} | {n} | {chunk or 'whole'} | {r['time_s']:.3f} | "
                      f"{r['time_s'] / whole['time_s']:.2f} | {r['peak_bytes'] / 2**20:,.0f} | "
                      f"{r['peak_bytes'] / whole['peak_bytes'] if whole['peak_bytes'] else float('nan'):.2f} |",
                      flush=True)  # a tiny step may not grow the RSS at all
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
