"""FreeSolo against SWA on the quickstart recipe: how loud the long-range read starts.

FS is SWA plus a routed long-range branch (docs/freesolo.md §1.1), so at equal size and
steps it should not be worse. This script trains each variant with `fsf train` on
`yamls/quickstart.yaml` (only the overrides of the variant and the seed change), evaluates
perplexity at 1x/2x/4x the training length with `fsf eval`, and prints one table: the mean
over seeds per variant, each seed's figures, and the learned readout gains (mean |g| per
layer) of the FreeSolo variants.

    python experiments/branch_scale.py --variants swa,fs-g1,fs-g0.1 --seeds 0,1 --out runs/branch-scale

Variants are `NAME` from VARIANTS below, or `NAME:key=value,key=value` for ad-hoc overrides.
Finished runs (a scores file present) are not retrained, so an interrupted sweep continues.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "yamls" / "quickstart.yaml"
LENGTHS = (512, 1024, 2048)

VARIANTS: dict[str, list[str]] = {
    "swa": ["model.name=swa"],
    "tfpp": ["model.name=tfpp"],
    "fs-g1": ["model.name=fs", "model.attention.readout_gain=1.0", "model.attention.readout_gain_param=linear", "model.attention.readout_backward=gain",
                 "model.attention.readout_gain_lr=1"],
    "fs-g0.3": ["model.name=fs", "model.attention.readout_gain=0.3", "model.attention.readout_gain_param=linear", "model.attention.readout_backward=gain",
                 "model.attention.readout_gain_lr=1"],
    "fs-g0.1": ["model.name=fs", "model.attention.readout_gain=0.1", "model.attention.readout_gain_param=linear", "model.attention.readout_backward=gain",
                 "model.attention.readout_gain_lr=1"],
    "fs-g0.03": ["model.name=fs", "model.attention.readout_gain=0.03", "model.attention.readout_gain_param=linear", "model.attention.readout_backward=gain",
                 "model.attention.readout_gain_lr=1"],
    "fs-g0": ["model.name=fs", "model.attention.readout_gain=0.0", "model.attention.readout_gain_param=linear", "model.attention.readout_backward=gain",
                 "model.attention.readout_gain_lr=1"],
    # the readout gains in their own optimizer group at a multiple of optim.lr
    "fs-g0.03-lr10": ["model.name=fs", "model.attention.readout_gain=0.03", "model.attention.readout_gain_param=linear", "model.attention.readout_backward=gain", "model.attention.readout_gain_lr=10"],
    "fs-g0.03-lr30": ["model.name=fs", "model.attention.readout_gain=0.03", "model.attention.readout_gain_param=linear", "model.attention.readout_backward=gain", "model.attention.readout_gain_lr=30"],
    "fs-g0.03-lr3": ["model.name=fs", "model.attention.readout_gain=0.03", "model.attention.readout_gain_param=linear", "model.attention.readout_backward=gain", "model.attention.readout_gain_lr=3"],
    # the default: g = 0.03 in the forward pass, the branch's gradient as at gain 1
    "fs-unit": ["model.name=fs", "model.attention.readout_gain=0.03", "model.attention.readout_gain_param=linear",
                "model.attention.readout_gain_lr=1", "model.attention.readout_backward=unit"],
    # log g learned at 10x optim.lr, from g = 0.03
    "fs-log-lr10": ["model.name=fs", "model.attention.readout_gain=0.03", "model.attention.readout_gain_param=log", "model.attention.readout_backward=gain",
                    "model.attention.readout_gain_lr=10"],
    "fs-gate-g1": ["model.name=fs", "model.attention.combine=gate", "model.attention.readout_gain=1.0", "model.attention.readout_gain_param=linear", "model.attention.readout_backward=gain",
                 "model.attention.readout_gain_lr=1"],
    "fs-gate-g0.03": ["model.name=fs", "model.attention.combine=gate", "model.attention.readout_gain=0.03", "model.attention.readout_gain_param=linear", "model.attention.readout_backward=gain",
                 "model.attention.readout_gain_lr=1"],
    "fs-lam0-g0.03": ["model.name=fs", "model.attention.lam=0.0", "model.attention.readout_gain=0.03", "model.attention.readout_gain_param=linear", "model.attention.readout_backward=gain",
                 "model.attention.readout_gain_lr=1"],
    "fsl-g1": ["model.name=fsl", "model.attention.readout_gain=1.0", "model.attention.readout_gain_param=linear", "model.attention.readout_backward=gain",
                 "model.attention.readout_gain_lr=1"],
    "fsl-g0.03": ["model.name=fsl", "model.attention.readout_gain=0.03", "model.attention.readout_gain_param=linear", "model.attention.readout_backward=gain",
                 "model.attention.readout_gain_lr=1"],
    "fs": ["model.name=fs"],  # whatever the default is
    "fsl": ["model.name=fsl"],
}


def parse_variant(spec: str) -> tuple[str, list[str]]:
    name, _, extra = spec.partition(":")
    if name not in VARIANTS and not extra:
        raise SystemExit(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)} or give NAME:key=value,...")
    return spec.replace(":", "_").replace("=", "").replace(",", "_"), VARIANTS.get(name, []) + (
        extra.split(",") if extra else [])


def fsf(*args: str, threads: int, log: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=f"{ROOT}:{ROOT / 'kernels'}")
    with log.open("a") as fh:
        subprocess.run([sys.executable, "-m", "fsframework", *args], cwd=ROOT, env=env, stdout=fh,
                       stderr=subprocess.STDOUT, check=True)


def run_one(name: str, overrides: list[str], seed: int, out: Path, steps: int, threads: int) -> dict:
    run_dir = out / f"{name}-s{seed}"
    scores_file = run_dir / "eval" / "perplexity.json"
    if not scores_file.is_file():
        run_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        fsf("train", str(CONFIG), f"run_dir={run_dir}", f"train.seed={seed}", f"train.max_steps={steps}",
            "train.progress=false", *overrides, threads=threads, log=run_dir / "log.txt")
        fsf("eval", str(run_dir), "--tasks", "perplexity", "--lengths", ",".join(map(str, LENGTHS)),
            "--out", str(scores_file), threads=threads, log=run_dir / "log.txt")
        (run_dir / "wall_s.txt").write_text(f"{time.time() - t0:.0f}\n")
    ppl = json.loads(scores_file.read_text())["scores"]["perplexity"]
    return {"variant": name, "seed": seed, "ppl": [float(ppl[str(n)]) for n in LENGTHS], "run_dir": str(run_dir),
            "wall_s": float((run_dir / "wall_s.txt").read_text())}


def build_data(threads: int) -> None:
    """The quickstart's embedded corpus shards (train and eval splits), built once."""
    code = ("from fsframework.config import load_config; from fsframework.data.loader import data_streams; "
            f"cfg = load_config({str(CONFIG)!r}); data_streams(cfg, 'train'); data_streams(cfg, 'eval')")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=f"{ROOT}:{ROOT / 'kernels'}")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True)


def readout_gains(run_dir: Path) -> list[float] | None:
    """Mean |g| of the long-range readout gain per layer, None for models without one."""
    import torch

    from fsframework.checkpoints import load_model

    model, _ = load_model(run_dir, torch.device("cpu"))
    gains = [float(layer.attn.readout_gain().detach().abs().mean()) for layer in model.layers
             if hasattr(layer.attn, "readout_gain")]
    return gains or None


def table(results: list[dict]) -> str:
    head = "| variant | seeds | " + " | ".join(f"ppl {n} ({n // LENGTHS[0]}x)" for n in LENGTHS) + \
        " | per seed (1x / 4x) | learned mean abs gain per layer |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name in dict.fromkeys(r["variant"] for r in results):
        rows = [r for r in results if r["variant"] == name]
        mean = [sum(r["ppl"][i] for r in rows) / len(rows) for i in range(len(LENGTHS))]
        seeds = "; ".join(f"{r['ppl'][0]:.2f} / {r['ppl'][-1]:.2f}" for r in rows)
        gains = "; ".join(" ".join(f"{g:.2f}" for g in r["gains"]) for r in rows if r["gains"]) or "-"
        lines.append(f"| {name} | {len(rows)} | " + " | ".join(f"{m:.2f}" for m in mean) + f" | {seeds} | {gains} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="swa,fs-g1,fs-g0.1")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (threads are shared out)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "branch-scale")
    args = parser.parse_args()
    variants = [parse_variant(v) for v in args.variants.split(",") if v]
    seeds = [int(s) for s in args.seeds.split(",")]
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    jobs = [(name, ov, seed) for seed in seeds for name, ov in variants]
    t0 = time.time()
    build_data(threads)  # once, before runs that would all build it at the same time
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda j: run_one(*j, args.out, args.steps, threads), jobs))
    for r in results:
        r["gains"] = readout_gains(Path(r["run_dir"]))
    results.sort(key=lambda r: ([v[0] for v in variants].index(r["variant"]), r["seed"]))
    text = table(results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    print(f"{len(jobs)} runs, {sum(r['wall_s'] for r in results) / 60:.0f} min of training and evaluation in all "
          f"(this invocation: {time.time() - t0:.0f} s; finished runs are reused)")


if __name__ == "__main__":
    main()
