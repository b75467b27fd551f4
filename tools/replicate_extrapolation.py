"""Tiny-scale replication of the length-extrapolation claim, on a CPU.

Trains TF++ (RoPE), SWA, FS and FS-L models of the same size on the same embedded
corpus at a short training length (`yamls/replicate-extrapolation.yaml`, FreeSolo
sizes s, B, w, K scaled down with the length), then evaluates passkey retrieval and
RULER `niah_single_1` at 1x, 2x, 4x, 8x and 16x the training length, and prints one
table (also written as JSON and markdown under the output directory).

    .venv/bin/python tools/replicate_extrapolation.py [--models tfpp,swa,fs,fsl] [--steps N]

Expected shape (paper): the FS family keeps retrieving past the training length; TF++
falls to near 0 beyond it; SWA cannot retrieve beyond its window.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "yamls" / "replicate-extrapolation.yaml"
TASKS = ["passkey", "niah_single_1"]
# Generation budgets in bytes: a space and the 5-digit passkey or the 7-digit value (greedy
# decoding runs a full forward pass per token, so every extra token costs a whole pass).
GEN_TOKENS = {"passkey": 6, "niah_single_1": 9}


def train(model: str, run_dir: Path, extra: list[str]) -> float:
    start = time.time()
    cmd = [sys.executable, "-m", "fsframework", "train", str(CONFIG), f"model.name={model}", f"run_dir={run_dir}",
           *extra]
    subprocess.run(cmd, cwd=REPO, check=True)
    return time.time() - start


def evaluate(run_dir: Path, lengths: list[int], num_samples: int, out: Path) -> dict:
    import torch

    from fsframework.data.tokenizers import load_tokenizer
    from fsframework.eval.suite import run_eval
    from fsframework.train.checkpoint import load_model

    model, cfg = load_model(run_dir)
    torch.set_grad_enabled(False)
    return run_eval(model, load_tokenizer(cfg.data.tokenizer), tasks=TASKS, lengths=lengths,
                    num_samples=num_samples, seed=0, batch_size=num_samples, out_path=str(out),
                    plots_dir=str(out.parent), data_dir=None, device=torch.device("cpu"), gen_tokens=GEN_TOKENS)


def markdown(table: dict, lengths: list[int], train_len: int) -> str:
    head = "| model | task | " + " | ".join(f"{n} ({n // train_len}x)" for n in lengths) + " |"
    rule = "|" + "---|" * (len(lengths) + 2)
    rows = [head, rule]
    for model, scores in table.items():
        for task in TASKS:
            cells = [scores[task].get(str(n)) for n in lengths]
            rows.append(f"| {model} | {task} | " + " | ".join("-" if c is None else f"{c:.0f}" for c in cells) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tfpp,swa,fs,fsl")
    parser.add_argument("--steps", type=int, default=None, help="override train.max_steps")
    parser.add_argument("--num-samples", type=int, default=10)
    parser.add_argument("--multiples", default="1,2,4,8,16")
    parser.add_argument("--out", default="runs/replicate")
    parser.add_argument("--skip-train", action="store_true", help="evaluate existing runs only")
    args = parser.parse_args()

    from fsframework.config import load_config

    base = load_config(CONFIG)
    train_len = base.data.seq_len
    lengths = [train_len * int(m) for m in args.multiples.split(",")]
    out_root = REPO / args.out
    extra = [f"train.max_steps={args.steps}"] if args.steps else []
    table, timing = {}, {}
    for model in args.models.split(","):
        run_dir = out_root / model
        if not args.skip_train:
            timing[model] = train(model, run_dir, extra)
        result = evaluate(run_dir, lengths, args.num_samples, run_dir / "eval" / "extrapolation.json")
        table[model] = result["scores"]
    summary = {"train_len": train_len, "lengths": lengths, "scores": table, "train_seconds": timing}
    (out_root / "table.json").write_text(json.dumps(summary, indent=1))
    text = markdown(table, lengths, train_len)
    (out_root / "table.md").write_text(text + "\n")
    print(text)
    for model, seconds in timing.items():
        print(f"{model}: trained in {seconds / 60:.1f} min")


if __name__ == "__main__":
    main()
