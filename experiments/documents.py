"""Document masking on the quickstart recipe: FS-L and TF++ trained on packed documents read apart
(`data.document_masking=true`) or together, each with 2 seeds (experiments/README.md, "Documents").

Every run is `fsf run yamls/quickstart.yaml` with its model, seed and masking, scored at 1x-4x the
training length on held-out documents at least that long, one document a window (`doc_perplexity`),
on the held-out stream as training packs it (`perplexity`) and on passkey retrieval. Beside them
the floors of the same rows: the perplexity of the documents' own byte frequencies (the best model
that knows which bytes are common but nothing of their order) and passkey's, a key guessed.

    .venv/bin/python experiments/documents.py --jobs 2 --out runs/documents

`--data DIR` trains and scores on shards of `fsf data build` instead of the embedded corpus (the
standard library's modules, `experiments/stdlib_corpus.py`, hold enough long documents for 4x-8x),
`--lengths` sets the scored lengths.

Writes `<out>/results.json` and prints a markdown table.
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

REPO = Path(__file__).resolve().parents[1]



def run(args, model: str, masking: bool, seed: int) -> Path:
    out = Path(args.out) / f"{model}-{'masked' if masking else 'packed'}-s{seed}"
    if not (out / "eval" / "scores.json").exists():
        cmd = [sys.executable, "-m", "fsframework", "run", str(REPO / "yamls" / "quickstart.yaml"), f"run_dir={out}",
               f"model.name={model}", f"train.seed={seed}", f"data.shuffle_seed={1234 + seed}",
               f"data.document_masking={str(masking).lower()}", "train.progress=false", "train.tensorboard=false",
               f"eval.tasks=[{args.tasks}]", f"eval.lengths=[{','.join(map(str, args.lengths))}]",
               f"eval.num_samples={args.samples}", *data_overrides(args), *args.override]
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
        if done.returncode:
            raise RuntimeError(f"{out} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return out


def data_overrides(args) -> list[str]:
    """The config overrides of `--data` (none: the embedded corpus)."""
    return [] if args.data is None else ["data.source=shards", f"data.path={Path(args.data).resolve()}"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="fsl,tfpp")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=10, help="windows per length and task")
    parser.add_argument("--out", default="runs/documents")
    parser.add_argument("--data", default=None, help="shards of `fsf data build` (default: the embedded corpus)")
    parser.add_argument("--tasks", default="doc_perplexity,perplexity,passkey", help="scored tasks (these three at most)")
    parser.add_argument("--lengths", default="512,1024,2048", help="scored lengths, the first the training length")
    parser.add_argument("override", nargs="*", help="config overrides for every run (key=value)")
    args = parser.parse_args(argv)
    args.lengths = [int(n) for n in args.lengths.split(",")]
    jobs = [(m, masking, int(s)) for s in args.seeds.split(",") for m in args.models.split(",")
            for masking in (False, True)]
    start = time.time()
    runs = [run(args, *jobs[0])]  # the first builds the embedded corpus, the others read it
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        runs += list(pool.map(lambda job: run(args, *job), jobs[1:]))
    results = []
    for (model, masking, seed), out in zip(jobs, runs):
        scores = json.loads((out / "eval" / "scores.json").read_text())
        results.append({"model": model, "masking": masking, "seed": seed, "scores": scores["scores"],
                        "floors": scores["scores"]["doc_perplexity_floor"],
                        "documents": scores["breakdown"]["doc_perplexity"]["documents"]})
    # the doc_perplexity windows' floor (their own byte frequencies), which `fsf eval` scores beside them
    floor = results[0]["floors"]
    Path(args.out, "results.json").write_text(json.dumps({"results": results, "floor": floor}, indent=1))
    lines = ["| model | documents | seed | doc ppl " + " / ".join(f"{n // args.lengths[0]}x" for n in args.lengths)
             + " | stream ppl | passkey % |", "|---|---|---|---|---|---|"]

    def fmt(values: dict, digits: int = 2) -> str:
        return " / ".join("-" if values.get(str(n)) is None else f"{values[str(n)]:.{digits}f}" for n in args.lengths)

    def passkey(values: dict) -> str:
        return fmt(values, 0)
    for r in results:
        s = r["scores"]
        lines.append(f"| {r['model']} | {'read apart' if r['masking'] else 'packed'} | {r['seed']} | "
                     f"{fmt(s['doc_perplexity'])} | {fmt(s.get('perplexity', {}))} | "
                     f"{passkey(s.get('passkey', {}))} |")
    lines.append(f"| floor | byte frequencies of the same windows | | {fmt(floor)} | | a key guessed: 0 |")
    counts = results[0]["documents"]
    print("\n".join(lines))
    print(f"held-out documents per length: {' / '.join(str(counts[str(n)]) for n in args.lengths)}; "
          f"wall time {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
