"""Associative recall beyond the training length: the recipe's extrapolation table (experiments/README.md).

Each variant trains through `fsf train yamls/mqar-cpu.yaml` (the recipe: 8 pairs in 128 tokens,
the induction warm-up, docs/evaluation.md §4.6) with its model and seed; FS-B is FS's checkpoint
read through FS-B's search after `fsf calibrate` (on recall rows). The stacked local windows
(`n_layers * window` = 32 tokens) reach far less than the training length: a pair further back
can only be read through what reads the whole prefix (full attention, FreeSolo's routed cells);
SWA is the control that must fail there. Every run is scored at multiples of its training
length: accuracy with its floor (a random value of the row, `fsframework.eval.mqar`) and the
share of answers that are one of the row's values, the beyond-reach split, and, for FreeSolo,
routing recall (how often the best layer's best head selects the answer's cell,
`experiments/routing.py`) next to its chance rate. `--curve` scores every kept checkpoint at 1x
and reports the first step at 95%.

    .venv/bin/python experiments/mqar.py --jobs 2 --seeds 0,1 --curve --out runs/mqar
    .venv/bin/python experiments/mqar.py --seeds 0,1 --curve --variants tfpp-nowarm,fs-nowarm

The recipe routes by the cells' token keys (`model.attention.route_score: tokens`, docs/freesolo.md
§1.13); `fs-mean` / `fsl-mean` train the paper's mean-key routing, and the `*-of-mean` / `fs-mean-*`
read paths score that checkpoint with the candidates of experiments/README.md, "Routing that holds
as cells multiply" (FS-B and its one-forest ablations, FS-B's norm filter or a row's own inside FS's
exact top-K, a prior growing with the eligible cells, the token-key score at read time only):

    .venv/bin/python experiments/mqar.py --jobs 2 --seeds 0,1,2 --curve --variants fs,fsl,fsb --out runs/mqar-tok
    .venv/bin/python experiments/mqar.py --jobs 2 --seeds 1,2 --factors 1,16,64 --out runs/mqar-base \
        --variants fs-mean,fs-mean-read-tokens,fsb-of-mean,fsb-f0-of-mean,fsb-ftau-of-mean,fs-mean-norm-tau,\
fs-mean-norm-row-median,fs-mean-lam-log

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
    "alibi": ["model.name=alibi"],
    "rewired": ["model.name=rewired"],
    "fs": ["model.name=fs"],
    "fsl": ["model.name=fsl"],
    # the routing prior at 4x its default weight (docs/freesolo.md §1.4), in training and reading
    "fs-lam4": ["model.name=fs", "model.attention.lam=4"],
    "fsl-lam4": ["model.name=fsl", "model.attention.lam=4"],
    # FS trained with the text default, the readout gains at 10x optim.lr
    "fs-glr10": ["model.name=fs", "model.attention.readout_gain_lr=10"],
    # without the induction warm-up: the floor's control
    "tfpp-nowarm": ["model.name=tfpp", "data.warmup.steps=0"],
    "fs-nowarm": ["model.name=fs", "data.warmup.steps=0"],
    # the recipe before route_score=tokens: routing by the cells' mean keys (Eq. 7, the paper's)
    "fs-mean": ["model.name=fs", "model.attention.route_score=mean"],
    "fsl-mean": ["model.name=fsl", "model.attention.route_score=mean"],
    # FS-L retaining 12 cells by key norm (the recipe: 6, fewer than a row's 8 pairs)
    "fsl-p12": ["model.name=fsl", "model.attention.retained_cells=12"],
    # routing among more cells per training row (experiments/README.md, "Routing that holds as cells
    # multiply"): cells of 4 tokens (32 a row, against 16 of 8), or rows of 512 tokens (64 cells of 8;
    # 8 rows a step, the same tokens per step)
    "fs-c4": ["model.name=fs", "model.attention.cell_size=4"],
    "fsl-c4": ["model.name=fsl", "model.attention.cell_size=4", "model.attention.retained_cells=12",
               "model.attention.recent_cells=4"],
    "fs-len512": ["model.name=fs", "data.seq_len=512", "data.micro_batch_size=8"],
}
# read paths scored from another variant's checkpoint: variant -> (trained, overrides, calibrated first,
# a candidate routing of experiments/routing.py or None)
READS = {
    "fsb": ("fs", ["model.name=fsb"], True, None),
    # FS's own whole-prefix routing read with 8 cells and the norm prior at 4x its training weight:
    # content scores against more cells at longer lengths, the prior holds out cells without a key
    "fs-k8-lam4": ("fs", ["model.attention.top_k=8", "model.attention.lam=4"], False, None),
    # the recipe's FS read with the paper's mean-key routing score
    "fs-read-mean": ("fs", ["model.attention.route_score=mean"], False, None),
    # FS trained with mean-key routing (the recipe before) read: with the token-key score; with FS-B and
    # its ablations (one forest of the two); with FS-B's norm filter, a row's own median filter or a
    # prior growing with the eligible cells inside FS's exact top-K (experiments/routing.py)
    "fs-mean-read-tokens": ("fs-mean", ["model.attention.route_score=tokens"], False, None),
    "fsb-of-mean": ("fs-mean", ["model.name=fsb"], True, None),
    "fsb-f0-of-mean": ("fs-mean", ["model.name=fsb", "model.attention.fsb.forests=f0"], True, None),
    "fsb-ftau-of-mean": ("fs-mean", ["model.name=fsb", "model.attention.fsb.forests=ftau"], True, None),
    "fs-mean-norm-tau": ("fs-mean", [], True, "norm-tau"),
    "fs-mean-norm-row-median": ("fs-mean", [], False, "norm-row-median"),
    "fs-mean-lam-log": ("fs-mean", [], False, "lam-log"),
    "fsb-of-fsl": ("fsl", ["model.name=fsb"], True, None),
}


def sizes(args) -> list[str]:
    """The recipe (yamls/mqar-cpu.yaml) as it is, with checkpoints every `--ckpt-every` steps kept
    for the steps-to-95% curve, and the command-line overrides."""
    return [f"train.ckpt_every={args.ckpt_every}", f"train.keep_checkpoints={args.steps // args.ckpt_every + 1}",
            f"train.max_steps={args.steps}", "train.log_every=25", "train.progress=false", "train.tensorboard=false"]


def _last_step(run: Path) -> int:
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    return json.loads(lines[-1])["step"] if lines else 0


def train(args, variant: str, seed: int) -> Path:
    run = Path(args.out) / f"{variant}-s{seed}"
    if args.fresh or _last_step(run) < args.steps:
        shutil.rmtree(run, ignore_errors=True)  # unfinished or unwanted: train from scratch
        cmd = [sys.executable, "-m", "fsframework", "train", str(REPO / "yamls" / "mqar-cpu.yaml"),
               f"run_dir={run}", f"train.seed={seed}", f"data.shuffle_seed={seed + 1234}", *sizes(args),
               *VARIANTS[variant], *args.override]
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
        if done.returncode:
            raise RuntimeError(f"training {run} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return run


def _checkpoints(run: Path) -> list[Path]:
    return sorted((run / "checkpoints").glob("step_*"))


def steps_to(args, run: Path, target: float) -> int | None:
    """The first kept checkpoint's step whose accuracy at 1x reaches `target` (None: none does)."""
    import torch

    from fsframework.checkpoints import load_model
    from fsframework.eval.mqar import mqar_scores

    for ckpt in _checkpoints(run):
        model, cfg = load_model(ckpt, torch.device("cpu"), [])
        reach = cfg.model.n_layers * cfg.model.attention.window
        found = mqar_scores(model, cfg.data.mqar, args.base_len, args.samples, 10_000, args.eval_batch, reach, "cpu")
        if found["score"] >= target:
            return int(ckpt.name.split("_")[1])
    return None


def score(args, run: Path, overrides: list[str], routing: bool = True, router: str | None = None) -> dict:
    """Accuracy, floor and in-row rate per length; routing recall of whole-prefix routing (not FS-B's
    search) where `routing`; `router`: a candidate routing (experiments/routing.py) replacing FS's."""
    import torch

    from experiments.routing import candidate_router, freesolo_layers, routing_recall
    from fsframework.checkpoints import CALIBRATION_FILE, Checkpoint, load_model
    from fsframework.data.mqar import recall_rows
    from fsframework.eval.mqar import mqar_scores

    torch.set_num_threads(1)
    model, cfg = load_model(run, torch.device("cpu"), overrides)
    model.eval()
    if router:
        if router == "norm-tau":
            from fsframework.models.freesolo_attention import set_fsb_thresholds

            file = Checkpoint.open(run).path / CALIBRATION_FILE
            set_fsb_thresholds(model, json.loads(file.read_text())["tau"], str(file))
        for layer in freesolo_layers(model):
            layer.router = candidate_router(layer, router)
    reach = cfg.model.n_layers * cfg.model.attention.window
    out = {}
    for factor in args.factors:
        length = factor * args.base_len
        found = mqar_scores(model, cfg.data.mqar, length, args.samples, 10_000, args.eval_batch, reach, "cpu")
        if freesolo_layers(model) and routing:
            rows = recall_rows(torch.Generator().manual_seed(20_000 + length), cfg.data.mqar, args.routing_rows, length)
            layers = routing_recall(model, rows.tokens[:, :-1], rows.source)
            best = max(layers, key=lambda r: -1 if math.isnan(r["best_head"]) else r["best_head"])
            found.update(routing_best_head=best["best_head"], routing_any_head=best["any_head"],
                         routing_chance=best["chance"], routing_layer=best["layer"], routing_queries=best["queries"])
        out[str(factor)] = found
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = [(r["step"], r["loss"]) for r in records]
    return {"scores": out, "loss_curve": curve, "final_loss": curve[-1][1] if curve else None}


def one(args, variant: str, seed: int) -> list[dict]:
    """Train `variant` (or reuse its run), score it, and score each read path that reads it."""
    start = time.time()
    run = train(args, variant, seed)
    trained = time.time() - start
    results = [{"variant": variant, "seed": seed, "train_s": trained, **score(args, run, []),
                "steps_to_95": steps_to(args, run, 95.0) if args.curve else None}]
    for read, (source, overrides, calibrated, router) in READS.items():
        if source == variant and read in args.variants:
            from fsframework.eval.calibrate import calibrate

            if calibrated:
                calibrate(run, seed=0, progress=False)
            fsb = "model.name=fsb" in overrides
            results.append({"variant": read, "seed": seed, "train_s": 0.0,
                            **score(args, run, overrides, routing=not fsb, router=router)})
    print(f"{variant} seed {seed}: trained in {trained:.0f} s, scored in {time.time() - start - trained:.0f} s",
          flush=True)
    return results


def table(args, results: list[dict]) -> str:
    """Accuracy / floor / in-row rate per length, every seed (seed 0; seed 1; ...), then FreeSolo's
    routing recall (best head) and the steps to 95% at 1x."""
    def num(value, scale=1.0):
        return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{scale * value:.1f}"

    head = " | ".join(f"{f}x acc / floor / in-row" for f in args.factors)
    lines = [f"| model | seed | {head} | beyond reach at {args.factors[-1]}x (floor) | routing recall "
             f"{args.factors[0]}x / {args.factors[-1]}x (chance) | steps to 95% at 1x |",
             "|---|---|" + "---|" * len(args.factors) + "---|---|---|"]
    for variant in args.variants:
        for r in sorted((r for r in results if r["variant"] == variant), key=lambda r: r["seed"]):
            sc = r["scores"]
            cells = [f"{num(sc[f]['score'])} / {num(sc[f]['floor'])} / {num(sc[f]['in_row'])}"
                     for f in map(str, args.factors)]
            first, last = str(args.factors[0]), str(args.factors[-1])
            routing = "–"
            if "routing_best_head" in sc[first]:
                routing = (f"{num(sc[first]['routing_best_head'], 100)} / {num(sc[last]['routing_best_head'], 100)} "
                           f"({num(sc[first]['routing_chance'], 100)} / {num(sc[last]['routing_chance'], 100)})")
            beyond = f"{num(sc[last]['beyond'])} ({num(sc[last]['beyond_floor'])})"
            to95 = "–" if not args.curve or variant in READS else (str(r["steps_to_95"]) if r.get("steps_to_95")
                                                                   else f"not by {args.steps}")
            lines.append(f"| {variant} | {r['seed']} | " + " | ".join(cells) + f" | {beyond} | {routing} | {to95} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="tfpp,fs,fsl,fsb,swa,alibi,rewired")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default="runs/mqar")
    parser.add_argument("--fresh", action="store_true", help="retrain runs that exist")
    parser.add_argument("--steps", type=int, default=3000, help="train.max_steps (the recipe's)")
    parser.add_argument("--ckpt-every", type=int, default=250, help="checkpoints kept for --curve")
    parser.add_argument("--curve", action="store_true", help="score every checkpoint at 1x: steps to 95%%")
    parser.add_argument("override", nargs="*", help="config overrides for every run (key=value)")
    parser.add_argument("--factors", default="1,4,16,64")
    parser.add_argument("--base-len", type=int, default=128,
                        help="the length of 1x: the recipe's data.seq_len, whatever a variant trains at")
    parser.add_argument("--samples", type=int, default=32, help="rows per length (8 queries each)")
    parser.add_argument("--eval-batch", type=int, default=8)
    parser.add_argument("--routing-rows", type=int, default=4)
    args = parser.parse_args(argv)
    args.variants = args.variants.split(",")
    args.factors = [int(f) for f in args.factors.split(",")]
    unknown = [v for v in args.variants if v not in VARIANTS and v not in READS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join([*VARIANTS, *READS])}")
    trained = [v for v in args.variants if v in VARIANTS]
    for v in args.variants:  # each checkpoint a read path needs, once
        if v in READS and READS[v][0] not in trained:
            trained.append(READS[v][0])
    jobs = [(v, int(s)) for s in args.seeds.split(",") for v in trained]
    start = time.time()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = [r for found in pool.map(lambda job: one(args, *job), jobs) for r in found]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    print(table(args, results))
    print(f"wall time {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
