"""The AR-GRC paper's length protocol at CPU size: one table and one plot of perplexity
against evaluation length for AR-GRC and the ALiBi / sinusoidal Transformers.

    for m in argrc alibi sinusoidal; do
      fsf train experiments/yamls/argrc-cpu.yaml model.name=$m run_dir=runs/argrc-cpu/$m
      fsf eval runs/argrc-cpu/$m --tasks perplexity --lengths 32:2976:128 --num-samples 4 \\
          --out runs/argrc-cpu/$m-scores.json
    done
    python experiments/argrc_lengths.py runs/argrc-cpu/{argrc,alibi,sinusoidal}-scores.json \\
        --plot runs/argrc-cpu/perplexity.png

Expected shape (paper): AR-GRC and ALiBi stay flat past the training length (512), the
sinusoidal Transformer's perplexity rises sharply beyond it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scores", nargs="+", type=Path, help="fsf eval --out files, one per model (name: file stem)")
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    series = {}
    for path in args.scores:
        name = path.stem.removesuffix("-scores")
        series[name] = {int(n): v for n, v in json.loads(path.read_text())["scores"]["perplexity"].items()}
    lengths = sorted(set().union(*series.values()))
    print("| length | " + " | ".join(series) + " |")
    print("|---:|" + "---:|" * len(series))
    for n in lengths:
        print(f"| {n} | " + " | ".join(f"{series[m].get(n, float('nan')):.2f}" for m in series) + " |")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for name, values in series.items():
            ax.plot(sorted(values), [values[n] for n in sorted(values)], marker=".", label=name)
        ax.axvline(512, color="grey", linestyle="--", linewidth=1, label="training length")
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_ylabel("perplexity")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
