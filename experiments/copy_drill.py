"""How many steps until a model copies from its context?

Trains a model of the registry (or, as an independent control, torch's own
`nn.TransformerEncoder`) on repeated passages of random tokens
(`fsframework.data.synthetic`) and prints, every `--every` steps, the mean loss on the
first copies (unpredictable) and on the predictable tokens of the second copies. The
onset of copying is the first step where the second-copy loss falls below half the
first-copy loss. Retrieval at any length needs this skill first, so this is the cheap
check to run before a long-context replication (experiments/replicate_extrapolation.py).

    .venv/bin/python experiments/copy_drill.py --model tfpp --steps 2000
    .venv/bin/python experiments/copy_drill.py --model torch   # the control: no fsframework model code

`--schedule 64:500,128:250,256:250,512:300` trains in stages of growing sequence length
(LENGTH:STEPS each; passages of `--min-passage`..LENGTH/4 tokens) and probes at the first
and the last length (or `--probe-lengths`): does copying learned in short sequences carry
over as they grow? The onset is read at the longest probe length. At a probe length never
trained on, the passages are probed twice: scaled with the length (copies further back than
in training) and as in training (the same distances in a longer sequence). `--save` keeps
the model at every probe and `--init` continues from it (e.g. more steps past the onset, or
other probes with `--steps 0`). `--routing` (FreeSolo models) also reports, at every probe, how
often routing selects the cell holding the token a copy needs (and, looser, a cell of the
passage's first copy, or one whose positions can already hold the source token through the
local windows below): the one part of FreeSolo that changes with the length.
`--probe-routing random|off` probes with random cells or none instead: if a model copies as
well without its routing, its copies do not come through routing. `--init-shared` starts one
kind of model from another's weights (TF++ into FS; with `--readout-gain 0` the FS model
starts as TF++ inside its window), `--combine` picks how FreeSolo's branches combine, and
`--set-head-gain LAYER.HEAD=GAIN` changes one head's readout gain over a loaded model.

Only torch is needed (no DeepSpeed, omegaconf or streaming), so it also runs on a bare
GPU machine (`--device cuda`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.copying import copy_losses, copying_onset  # noqa: E402
from experiments.routing import ABLATIONS, freesolo_layers, routing_ablation, routing_report  # noqa: E402
from fsframework.config import COMBINE_MODES  # noqa: E402
from fsframework.models.registry import KINDS  # noqa: E402
from fsframework.data.synthetic import repeat_batch, repeat_batch_with_sources  # noqa: E402

# the FreeSolo kinds the drill can train (fsb is a read path over fs weights)
FREESOLO_MODELS = tuple(name for name, kind in KINDS.items() if kind.freesolo and kind.trainable)


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


def stages(args) -> list[tuple[int, int, int]]:
    """(sequence length, steps, longest passage) of each training stage."""
    if not args.schedule:
        return [(args.seq_len, args.steps, args.max_passage)]
    out = []
    for item in args.schedule.split(","):
        try:
            length, steps = (int(x) for x in item.split(":"))
        except ValueError:
            raise SystemExit(f"--schedule: {item!r} is not LENGTH:STEPS") from None
        out.append((length, steps, max(length // 4, args.min_passage or 2)))
    return out


def probe_lengths(args, plan: list[tuple[int, int, int]]) -> list[int]:
    if args.probe_lengths:
        return sorted({int(x) for x in args.probe_lengths.split(",")})
    return sorted({plan[0][0], plan[-1][0]})


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def build(args, max_len: int) -> nn.Module:
    if args.model == "torch":
        return TorchEncoderLM(args.vocab, args.d_model, args.layers, args.heads, max_len)
    from fsframework.config import AttentionConfig, ModelConfig
    from fsframework.models.registry import build_model

    attention = AttentionConfig(window=args.window, cell_size=args.cell_size, block_size=args.block_size,
                                top_k=args.top_k, retained_cells=args.retained_cells, recent_cells=args.recent_cells,
                                combine=args.combine, readout_gain_param="linear")  # the drill sets gains directly
    return build_model(ModelConfig(name=args.model, vocab_size=args.vocab, d_model=args.d_model,
                                   n_layers=args.layers, n_heads=args.heads, init_std=args.init_std,
                                   attention=attention))


def drill(args) -> list[dict]:
    """Train through the stages; every `--every` steps a record with the training length and,
    per probe length, the losses on 1st and 2nd copies (`first`/`second`: the longest)."""
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    plan = stages(args)
    lengths = probe_lengths(args, plan)
    model = build(args, max(lengths + [length for length, _, _ in plan])).to(device)
    if args.readout_gain is not None:  # before loading: an --init model's own gains replace it
        with torch.no_grad():
            for layer in freesolo_layers(model):
                layer.lr_norm_weight.fill_(args.readout_gain)
    first_step = 0
    if args.init:  # continue from a saved drill model (same model flags), with a fresh optimizer
        saved = torch.load(args.init, map_location=device, weights_only=True)
        # --init-shared: a model of another kind (TF++ weights into FS); the tensors only this
        # model has (FreeSolo's readout gain, sigma, lam) stay as initialised. Shapes must fit.
        missing, unexpected = model.load_state_dict(saved["model"], strict=not args.init_shared)
        if unexpected:
            raise SystemExit(f"--init {args.init}: tensors this model does not have: {', '.join(unexpected)}")
        if missing:
            print(f"--init-shared: kept at their initialisation: {', '.join(missing)}", flush=True)
        first_step = saved.get("step", 0)  # steps count on from the saved model's
    layers = freesolo_layers(model)
    for spec in args.set_head_gain:  # after loading: one head's readout gain, every other tensor as trained
        where, _, value = spec.partition("=")
        layer, _, head = where.partition(".")
        if not (_is_float(value) and layer.isdigit() and head.isdigit() and int(layer) < len(layers)
                and int(head) < layers[0].cfg.n_heads):
            raise SystemExit(f"--set-head-gain {spec!r}: expected LAYER.HEAD=GAIN with a layer < {len(layers)} "
                             f"and a head < {layers[0].cfg.n_heads}")
        with torch.no_grad():
            layers[int(layer)].lr_norm_weight[int(head)].fill_(float(value))
    if args.set_lam is not None:  # after loading: the prior weight is a buffer saved with the model
        for layer in layers:
            layer.lam.fill_(args.set_lam)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    # training batches continue past those the saved model saw; the held-out probes stay the same
    data = torch.Generator().manual_seed(args.seed + 1_000_003 * first_step)
    held_out = torch.Generator().manual_seed(10_000 + args.seed)
    longest_passage = {length: passage for length, _, passage in plan}
    last_length, _, last_passage = plan[-1]
    probes, at_train_distances = {}, {}
    for length in lengths:
        # passages as in training at that length; at a length never trained on, the last stage's
        # passages scaled with the length, so copies lie up to that many times further back
        # (the distance extrapolation that passkey retrieval at k x the training length needs)
        rows = max(1, min(16, 2048 // length))
        passage = longest_passage.get(length, max(last_passage * length // last_length, args.min_passage or 2))
        probes[length] = [t.to(device) for t in repeat_batch_with_sources(held_out, rows, length, args.draw, passage,
                                                                          args.min_passage)]
        if length not in longest_passage:
            # and with the last stage's passages: the same distances in a longer sequence, which
            # separates "more tokens around" from "further back"
            at_train_distances[length] = [t.to(device) for t in repeat_batch_with_sources(
                held_out, rows, length, args.draw, last_passage, args.min_passage)]
    records, start, step = [], time.time(), first_step
    total = first_step + sum(steps for _, steps, _ in plan)

    # the furthest back any training copy lies: a passage of n tokens is copied from n - 1 back
    trained_distance = max(passage for _, _, passage in plan) - 1

    def losses_on(batches: dict) -> dict[str, dict[str, float]]:
        """Per probe length: 1st- and 2nd-copy losses, and the 2nd-copy losses of the copies whose
        source lies beyond `--window` (FreeSolo reads those only through its long-range branch)
        and beyond every training distance (pure distance extrapolation)."""
        out = {}
        for length, (tokens, first, second, source) in batches.items():
            logits, targets = model(tokens[:, :-1]), tokens[:, 1:]
            back = torch.arange(length, device=device) - source
            a, b = copy_losses(logits, targets, first, second)
            out[str(length)] = {"first": a, "second": b}
            for name, limit in (("beyond_window", args.window), ("beyond_training", trained_distance)):
                far = second & (back > limit)
                out[str(length)][name] = copy_losses(logits, targets, first, far)[1] if far.any() else None
        return out

    def routing_on(batches: dict, tag: str = "") -> dict[str, list[dict]]:
        """Per probe, per layer: routing recall and, where the source's cell was selected, the
        readout's weight on the source token (`readout_*`; chance: the uniform 1 / (K s))."""
        return {f"{length}{tag}": routing_report(model, tokens[:, :-1], source)
                for length, (tokens, _, _, source) in batches.items()}

    def shown(losses: dict[str, float]) -> str:
        text = f"{losses['first']:6.3f} / {losses['second']:6.3f}"
        for name, tag in (("beyond_window", "beyond w"), ("beyond_training", "beyond training")):
            if losses[name] is not None:
                text += f" [{tag} {losses[name]:6.3f}]"
        return text

    def probe(seq_len: int) -> None:
        model.eval()
        ablation = (routing_ablation(model, args.probe_routing) if args.probe_routing != "learned"
                    else contextlib.nullcontext())
        with torch.no_grad(), ablation:
            by_length, near = losses_on(probes), losses_on(at_train_distances)
            routing = {**routing_on(probes), **routing_on(at_train_distances, "@train")} if args.routing else {}
        model.train()
        longest = by_length[str(lengths[-1])]
        records.append({"step": step, "seq_len": seq_len, "first": longest["first"], "second": longest["second"],
                        "by_length": by_length, "at_train_distances": near, "routing": routing,
                        "seconds": time.time() - start})
        losses = "  ".join(f"@{n}: {shown(x)}" + (f" (train distances {shown(near[n])})" if n in near else "")
                           for n, x in by_length.items())
        print(f"step {step:6d}  training length {seq_len:5d}  loss on 1st / 2nd copy {losses}  "
              f"{time.time() - start:7.0f}s", flush=True)
        if routing:  # per probe and target, the layer whose best head finds it most often
            print("             routing recall (best head of the best layer / chance; source cell, passage, reach), "
                  "readout weight on the source when its cell is selected (/ uniform):"
                  + "".join(f"\n               @{name}: " + "  ".join(best_layer(layers, prefix) for prefix in
                                                               ("", "passage_", "reach_", "readout_"))
                            for name, layers in routing.items()), flush=True)
        write_records(args, records)  # at every probe: a stopped run keeps what it measured
        if args.save:
            save()

    def best_layer(layers: list[dict], prefix: str) -> str:
        layer = max(layers, key=lambda r: -1.0 if math.isnan(r[f"{prefix}best_head"]) else r[f"{prefix}best_head"])
        return f"{layer[f'{prefix}best_head']:.2f} / {layer[f'{prefix}chance']:.2f}"

    def save() -> None:  # written whole, then renamed: a killed run never leaves half a file
        tmp = Path(args.save).with_name(Path(args.save).name + ".tmp")
        torch.save({"args": vars(args), "step": step, "model": model.state_dict()}, tmp)
        tmp.replace(args.save)

    for seq_len, steps, passage in plan:
        batch = max(1, args.batch_tokens // seq_len)
        for _ in range(steps):
            if (step - first_step) % args.every == 0:  # a continued run probes its starting model first
                probe(seq_len)
            tokens, _, _ = repeat_batch(data, batch, seq_len, args.draw, passage, args.min_passage)
            tokens = tokens.to(device)
            logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step += 1
    probe(plan[-1][0])  # and, with --save, the final model
    assert step == total
    return records


def write_records(args, records: list[dict]) -> None:
    if args.out:
        tmp = Path(args.out).with_name(Path(args.out).name + ".tmp")
        tmp.write_text(json.dumps({"args": vars(args), "records": records, "onset": copying_onset(records)}, indent=1))
        tmp.replace(args.out)


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
    parser.add_argument("--min-passage", type=int, default=None, help="shortest passage (default: max/4)")
    parser.add_argument("--schedule", default=None,
                        help="LENGTH:STEPS,... stages of growing length (replaces --seq-len/--steps)")
    parser.add_argument("--probe-lengths", default=None, help="comma-separated probe lengths")
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--init-std", type=float, default=0.02, help="model.init_std (registry models)")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--out", default=None, help="also write the records as JSON here")
    parser.add_argument("--save", default=None,
                        help="write the model here (torch.save) at every probe and at the end")
    parser.add_argument("--init", default=None, help="start from a model written by --save (same model flags)")
    parser.add_argument("--init-shared", action="store_true",
                        help="--init from another kind of model (e.g. TF++ weights into FS): load the tensors "
                             "both have, keep the rest at their initialisation")
    parser.add_argument("--routing", action="store_true",
                        help="FreeSolo models: at every probe, how often routing selects the cell a copy reads "
                             "(experiments/routing.py)")
    # FreeSolo sizes, scaled like experiments/yamls/replicate-extrapolation.yaml
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--cell-size", type=int, default=16)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--retained-cells", type=int, default=8)
    parser.add_argument("--recent-cells", type=int, default=2)
    parser.add_argument("--probe-routing", choices=("learned", *ABLATIONS), default="learned",
                        help="FreeSolo models: probe with the learned routing, K random eligible cells, or none "
                             "(long-range branch off); training always uses the learned one")
    parser.add_argument("--set-lam", type=float, default=None,
                        help="FreeSolo prior weight lambda for every head, also over an --init model "
                             "(e.g. 0 with --steps 0: routing by content alone)")
    parser.add_argument("--combine", choices=COMBINE_MODES, default="sum",
                        help="FreeSolo models: how the two branches combine (model.attention.combine); 'gate' "
                             "lets a token scale the long-range readout, which the RMSNorm keeps at unit size")
    parser.add_argument("--readout-gain", type=float, default=None,
                        help="FreeSolo models: initial gain of the long-range readout RMSNorm (default 1). "
                             "With --init-shared from TF++ weights, 0 starts FS as TF++ inside the window: "
                             "the long-range branch enters only as its gain grows")
    parser.add_argument("--set-head-gain", action="append", default=[], metavar="LAYER.HEAD=GAIN",
                        help="FreeSolo models: set one head's readout gain after loading (repeatable), e.g. "
                             "2.0=10 with --steps 0: what that head's routed reads do to the losses")
    args = parser.parse_args(argv)

    if args.model not in FREESOLO_MODELS and (args.routing or args.probe_routing != "learned"
                                              or args.set_lam is not None or args.readout_gain is not None
                                              or args.combine != "sum" or args.set_head_gain):
        raise SystemExit("--routing, --probe-routing, --set-lam, --readout-gain, --set-head-gain and --combine "
                         f"need a FreeSolo model {FREESOLO_MODELS}, not {args.model!r}")
    if args.threads:
        torch.set_num_threads(args.threads)
    records = drill(args)
    onset = copying_onset(records)
    chance = math.log(args.draw)
    at = f"at {max(int(n) for n in records[-1]['by_length'])} tokens"  # the onset's probe length
    print(f"{args.model}: " + (f"copies {at} from step {onset} (2nd-copy loss < half the 1st)" if onset is not None
                               else f"no copying {at} within {records[-1]['step']} steps (chance loss {chance:.2f})"))


if __name__ == "__main__":
    main()
