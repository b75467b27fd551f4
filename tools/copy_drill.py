"""How many steps until a model copies from its context?

Trains a model of the registry (or, as an independent control, torch's own
`nn.TransformerEncoder`) on repeated passages of random tokens
(`fsframework.eval.copying`) and prints, every `--every` steps, the mean loss on the
first copies (unpredictable) and on the predictable tokens of the second copies. The
onset of copying is the first step where the second-copy loss falls below half the
first-copy loss. Retrieval at any length needs this skill first, so this is the cheap
check to run before a long-context replication (tools/replicate_extrapolation.py).

    .venv/bin/python tools/copy_drill.py --model tfpp --steps 2000
    .venv/bin/python tools/copy_drill.py --model torch   # the control: no fsframework model code

Only torch is needed (no DeepSpeed, omegaconf or streaming), so it also runs on a bare
GPU machine (`--device cuda`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fsframework.eval.copying import copy_losses, copying_onset, repeat_batch  # noqa: E402


class TorchEncoderLM(nn.Module):
    """Causal LM on `nn.TransformerEncoder` (pre-norm, learned absolute positions): a control
    that shares no code with fsframework's models."""

    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, max_len: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        x = self.embed(tokens) + self.pos(torch.arange(seq, device=tokens.device))
        mask = nn.Transformer.generate_square_subsequent_mask(seq, device=tokens.device)
        return self.head(self.norm(self.encoder(x, mask=mask, is_causal=True)))


def build(args) -> nn.Module:
    if args.model == "torch":
        return TorchEncoderLM(args.vocab, args.d_model, args.layers, args.heads, args.seq_len)
    from fsframework.config import AttentionConfig, ModelConfig
    from fsframework.models.registry import build_model

    attention = AttentionConfig(window=args.window, cell_size=args.cell_size, block_size=args.block_size,
                                top_k=args.top_k, retained_cells=args.retained_cells, recent_cells=args.recent_cells)
    return build_model(ModelConfig(name=args.model, vocab_size=args.vocab, d_model=args.d_model,
                                   n_layers=args.layers, n_heads=args.heads, init_std=args.init_std,
                                   attention=attention))


def drill(args) -> list[dict]:
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = build(args).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    data, held_out = torch.Generator().manual_seed(args.seed), torch.Generator().manual_seed(10_000 + args.seed)
    probe = [t.to(device) for t in repeat_batch(held_out, 16, args.seq_len, args.draw, args.max_passage)]
    batch = max(1, args.batch_tokens // args.seq_len)
    records, start = [], time.time()
    for step in range(args.steps + 1):
        if step % args.every == 0:
            model.eval()
            with torch.no_grad():
                first, second = copy_losses(model(probe[0][:, :-1]), probe[0][:, 1:], probe[1], probe[2])
            model.train()
            records.append({"step": step, "first": first, "second": second, "seconds": time.time() - start})
            print(f"step {step:6d}  loss on 1st copy {first:6.3f}  on 2nd copy {second:6.3f}  "
                  f"{time.time() - start:7.0f}s", flush=True)
        if step == args.steps:
            break
        tokens, _, _ = repeat_batch(data, batch, args.seq_len, args.draw, args.max_passage)
        tokens = tokens.to(device)
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tfpp", help="a registry name (tfpp, swa, fs, fsl, ...) or 'torch'")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--draw", type=int, default=256, help="passages use token ids 0..draw-1")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--max-passage", type=int, default=50, help="passages are max/4..max tokens")
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--init-std", type=float, default=0.02, help="model.init_std (registry models)")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--out", default=None, help="also write the records as JSON here")
    # FreeSolo sizes, scaled like yamls/replicate-extrapolation.yaml
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--cell-size", type=int, default=16)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--retained-cells", type=int, default=8)
    parser.add_argument("--recent-cells", type=int, default=2)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    records = drill(args)
    onset = copying_onset(records)
    chance = math.log(args.draw)
    print(f"{args.model}: " + (f"copies from step {onset} (2nd-copy loss < half the 1st)" if onset is not None
                               else f"no copying within {args.steps} steps (chance loss {chance:.2f})"))
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "records": records, "onset": onset}, indent=1))


if __name__ == "__main__":
    main()
