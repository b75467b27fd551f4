"""Associative recall beyond the training length: TF++, SWA, FS and FS-L at 1x-16x (experiments/README.md).

Each variant trains through `fsf train` on `data.source=mqar` (docs/evaluation.md §4.6) with the
same sizes, chosen so that the stacked local windows (`n_layers * window` tokens) reach far
less than the training length: a pair further back can only be read through what reads the
whole prefix (full attention, FreeSolo's routed cells); SWA is the control that must fail
there. Then every run is scored at multiples of its training length with the pairs spread
over the whole context: accuracy over all queries and split within / beyond the reach, and,
for FreeSolo, routing recall (how often a head's selected cells hold the answer; the best layer
and head, `experiments/routing.py`) next to its chance rate.

    .venv/bin/python experiments/mqar.py --jobs 2 --seeds 0,1 --variants tfpp,swa,fs,fsl,fs-g1

Writes `<out>/results.json` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VARIANTS = {
    "tfpp": ["model.name=tfpp"],
    "swa": ["model.name=swa"],
    "fs": ["model.name=fs"],  # the default readout gain (0.03, log g at 10x lr)
    "fsl": ["model.name=fsl"],
    "fs-g1": ["model.name=fs", "model.attention.readout_gain=1.0", "model.attention.readout_gain_param=linear", "model.attention.readout_backward=gain", "model.attention.readout_gain_lr=1.0"],
    "fs-g0.03": ["model.name=fs", "model.attention.readout_gain=0.03", "model.attention.readout_gain_param=linear", "model.attention.readout_backward=gain", "model.attention.readout_gain_lr=1.0"],
    "fs-g0.03-lr10": ["model.name=fs", "model.attention.readout_gain=0.03", "model.attention.readout_gain_param=linear", "model.attention.readout_backward=gain", "model.attention.readout_gain_lr=10"],
    "fs-g0.03-lr30": ["model.name=fs", "model.attention.readout_gain=0.03", "model.attention.readout_gain_param=linear", "model.attention.readout_backward=gain", "model.attention.readout_gain_lr=30"],
    "fs-g0.03-lr3": ["model.name=fs", "model.attention.readout_gain=0.03", "model.attention.readout_gain_param=linear", "model.attention.readout_backward=gain", "model.attention.readout_gain_lr=3"],
    # the default: g = 0.03 in the forward pass, the branch's gradient as at gain 1
    "fs-unit": ["model.name=fs", "model.attention.readout_gain=0.03", "model.attention.readout_gain_param=linear",
                "model.attention.readout_gain_lr=1", "model.attention.readout_backward=unit"],
    # log g learned at 10x optim.lr, from g = 0.03
    "fs-log-lr10": ["model.name=fs", "model.attention.readout_gain=0.03", "model.attention.readout_gain_param=log", "model.attention.readout_backward=gain",
                    "model.attention.readout_gain_lr=10"],
}


def sizes(args) -> list[str]:
    return ["data.source=mqar", f"data.seq_len={args.seq_len}", f"data.micro_batch_size={args.batch}",
            f"data.mqar.pairs={args.pairs}", f"data.mqar.queries={args.queries or args.pairs}", "data.mqar.keys=64",
            "data.mqar.values=64", "data.mqar.filler=16",
            f"model.d_model={args.d_model}", "model.n_layers=2", "model.n_heads=2",
            f"model.attention.window={args.window}", f"model.attention.block_size={args.window}",
            f"model.attention.cell_size={args.cell}", f"model.attention.top_k={args.top_k}",
            # FS-L keeps 6 of the 16 cells of a 128-token sequence (the paper: 72 of 128 at 4k), so it
            # prunes in training too, not only past the training length
            "model.attention.retained_cells=6", "model.attention.recent_cells=2",
            f"optim.lr={args.lr}", f"optim.warmup_steps={args.warmup}", "optim.weight_decay=0.0",
            f"train.max_steps={args.steps}", f"train.ckpt_every={args.steps}", "train.keep_checkpoints=1",
            "train.log_every=25", "train.progress=false", "train.tensorboard=false"]


def _last_step(run: Path) -> int:
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    return json.loads(lines[-1])["step"] if lines else 0


def train(args, variant: str, seed: int) -> Path:
    run = Path(args.out) / f"{variant}-s{seed}"
    if args.fresh or _last_step(run) < args.steps:
        shutil.rmtree(run, ignore_errors=True)  # unfinished or unwanted: train from scratch
        cmd = [sys.executable, "-m", "fsframework", "train", str(REPO / "yamls" / "quickstart.yaml"),
               f"run_dir={run}", f"train.seed={seed}", f"data.shuffle_seed={seed + 1234}", *sizes(args),
               *VARIANTS[variant], *args.override]
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
        if done.returncode:
            raise RuntimeError(f"training {run} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return run


def score(args, run: Path) -> dict:
    import torch

    from experiments.routing import freesolo_layers, routing_recall
    from fsframework.checkpoints import load_model
    from fsframework.data.mqar import recall_rows
    from fsframework.eval.mqar import mqar_scores

    torch.set_num_threads(1)
    model, cfg = load_model(run, torch.device("cpu"), [])
    model.eval()
    reach = cfg.model.n_layers * cfg.model.attention.window
    out = {}
    for factor in args.factors:
        length = factor * args.seq_len
        found = mqar_scores(model, cfg.data.mqar, length, args.samples, 10_000, args.eval_batch, reach, "cpu")
        if freesolo_layers(model):
            rows = recall_rows(torch.Generator().manual_seed(20_000 + length), cfg.data.mqar, args.routing_rows, length)
            layers = routing_recall(model, rows.tokens[:, :-1], rows.source)
            best = max(layers, key=lambda r: -1 if math.isnan(r["best_head"]) else r["best_head"])
            found.update(routing_best_head=best["best_head"], routing_any_head=best["any_head"],
                         routing_chance=best["chance"], routing_layer=best["layer"], routing_queries=best["queries"])
        out[str(factor)] = found
    gains = [round(float(layer.readout_gain().abs().mean()), 3) for layer in freesolo_layers(model)]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = [(r["step"], r["loss"]) for r in records]
    return {"scores": out, "loss_curve": curve, "final_loss": curve[-1][1] if curve else None,
            "mean_abs_gain": gains}


def one(args, variant: str, seed: int) -> dict:
    start = time.time()
    run = train(args, variant, seed)
    trained = time.time() - start
    result = score(args, run)
    print(f"{variant} seed {seed}: trained in {trained:.0f} s, scored in {time.time() - start - trained:.0f} s",
          flush=True)
    return {"variant": variant, "seed": seed, "train_s": trained, **result}


def table(args, results: list[dict]) -> str:
    def fmt(values):
        values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
        return f"{sum(values) / len(values):.0f}" if values else "–"

    head = " | ".join(f"{f}x all / within / beyond" for f in args.factors)
    lines = [f"| model | {head} | routing recall (best head; chance) at 1x / {args.factors[-1]}x |",
             "|---|" + "---|" * len(args.factors) + "---|"]
    for variant in args.variants:
        runs = [r for r in results if r["variant"] == variant]
        cells = []
        for f in map(str, args.factors):
            cells.append(" / ".join(fmt([r["scores"][f][key] for r in runs]) for key in ("score", "within", "beyond")))
        first, last = str(args.factors[0]), str(args.factors[-1])
        if "routing_best_head" in runs[0]["scores"][first]:
            recall = "; ".join(f"{fmt([100 * r['scores'][f]['routing_best_head'] for r in runs])}% "
                               f"({fmt([100 * r['scores'][f]['routing_chance'] for r in runs])}%)" for f in (first, last))
        else:
            recall = "–"
        lines.append(f"| {variant} | " + " | ".join(cells) + f" | {recall} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="tfpp,swa,fs,fsl,fs-g1")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default="runs/mqar")
    parser.add_argument("--fresh", action="store_true", help="retrain runs that exist")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=2500)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--queries", type=int, default=0, help="queries per row (0: one per pair)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("override", nargs="*", help="config overrides for every run (key=value)")
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--cell", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--factors", default="1,2,4,8,16")
    parser.add_argument("--samples", type=int, default=32, help="rows per length (each with --pairs queries)")
    parser.add_argument("--eval-batch", type=int, default=8)
    parser.add_argument("--routing-rows", type=int, default=4)
    args = parser.parse_args(argv)
    args.variants = args.variants.split(",")
    args.factors = [int(f) for f in args.factors.split(",")]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    jobs = [(v, int(s)) for s in args.seeds.split(",") for v in args.variants]
    start = time.time()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda job: one(args, *job), jobs))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    print(table(args, results))
    print(f"wall time {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
