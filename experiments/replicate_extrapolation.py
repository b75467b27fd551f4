"""Tiny-scale replication of the length-extrapolation claim, on a CPU.

Trains TF++ (RoPE), SWA, FS and FS-L models of the same size on the same embedded
corpus at a short training length (`experiments/yamls/replicate-extrapolation.yaml`,
FreeSolo sizes s, B, w, K scaled down with the length), then evaluates passkey retrieval
and RULER `niah_single_1` at 1x, 2x, 4x, 8x and 16x the training length, and prints one
table (also written as JSON and markdown under the output directory).

    .venv/bin/python experiments/replicate_extrapolation.py [--models tfpp,swa,fs,fsl] [--steps N]

`--config experiments/yamls/replicate-extrapolation-128.yaml` trains at 128 tokens instead
of 512, where the copy drill's models cross the induction plateau on a CPU; `--init-from
runs/drill/{model}.pt` starts each model from weights the drill saved
(`experiments/copy_drill.py --save`, same model flags), so the corpus steps begin from a
model that already copies.

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
CONFIG = REPO / "experiments" / "yamls" / "replicate-extrapolation.yaml"
TASKS = ["passkey", "niah_single_1"]
# Generation budgets in tokens: room for a space and the 5-digit passkey or the 7-digit value
# even with a byte tokenizer (the BPE of the replication config needs 3-5 tokens).
GEN_TOKENS = {"passkey": 6, "niah_single_1": 9}


def ensure_tokenizer(spec: str, vocab_size: int) -> None:
    """Train the config's BPE tokenizer on the embedded corpus when the file is missing."""
    if spec == "byte" or (REPO / spec).is_file():
        return
    subprocess.run([sys.executable, "-m", "fsframework", "data", "tokenizer", spec, "--vocab-size", str(vocab_size)],
                   cwd=REPO, check=True)


def train(config: Path, model: str, run_dir: Path, extra: list[str]) -> float:
    start = time.time()
    cmd = [sys.executable, "-m", "fsframework", "train", str(config), f"model.name={model}", f"run_dir={run_dir}",
           *extra]
    subprocess.run(cmd, cwd=REPO, check=True)
    return time.time() - start


def copy_probe(model, tokenizer, train_len: int, num_docs: int = 20) -> tuple[float, float]:
    """Mean next-token loss on the first and on the second copy of a repeated passage of random
    words or numbers (held-out draws of the corpus's repeat documents). A model that copies from
    context scores far lower on the second copy; equal losses mean no in-context copying at all,
    which no retrieval score can then overcome. The documents scale with the training length
    (1200 characters at 512 tokens: the second copy lies within the training length)."""
    chars = 1200 * train_len // 512
    import random

    import torch

    from fsframework.data.stdlib_text import stdlib_prose
    from fsframework.data.retrieval_docs import REPEAT_AGAIN, REPEAT_INTRO, key_words, random_passage

    prose = stdlib_prose(300_000)
    words, rng = key_words(prose), random.Random(12345)
    first, second = [], []
    for i in range(num_docs):
        passage = random_passage(prose, words, rng, chars // 3, kind=("words", "numbers")[i % 2])
        prefix = tokenizer.encode(REPEAT_INTRO + passage + REPEAT_AGAIN)
        ids = torch.tensor([prefix + tokenizer.encode(passage)])
        logp = torch.log_softmax(model(ids)[0, :-1].float(), dim=-1)
        nll = -logp.gather(1, ids[0, 1:, None])[:, 0]
        first.append(nll[8:len(prefix) - 12].mean().item())
        second.append(nll[len(prefix) + 2:].mean().item())
    return sum(first) / num_docs, sum(second) / num_docs


def evaluate(run_dir: Path, lengths: list[int], num_samples: int, out: Path) -> dict:
    import torch

    from fsframework.checkpoints import load_model
    from fsframework.data.tokenizers import load_tokenizer
    from fsframework.eval.suite import run_eval

    model, cfg = load_model(run_dir)
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    with torch.no_grad():  # scoped: the next model of the same process trains
        first, second = copy_probe(model, tokenizer, cfg.data.seq_len)
        print(f"{run_dir.name}: copy probe, loss on the first copy {first:.2f}, on the second copy {second:.2f}")
        scores = run_eval(model, tokenizer, tasks=TASKS, lengths=lengths, num_samples=num_samples, seed=0,
                          batch_size=num_samples, out_path=str(out), plots_dir=str(out.parent), data_dir=None,
                          device=torch.device("cpu"), gen_tokens=GEN_TOKENS)
    return {"copy_probe": {"first": first, "second": second}, **scores}


def beyond_reach(samples: dict, reach: int) -> dict:
    """Per task and length, the mean score over the samples whose needle ends more than `reach`
    tokens before the prompt does, with their count. With reach = n_layers x window, hits there
    cannot come through stacked local windows (SWA's, FreeSolo's local branch): only through
    FreeSolo's routed cells or full attention. `samples`: run_eval's records, task -> length -> list."""
    out = {}
    for task, by_length in samples.items():
        out[task] = {}
        for length, rows in by_length.items():
            far = [r["score"] for r in rows if r["needle_tokens_back"] > reach]
            out[task][length] = {"score": sum(far) / len(far) if far else None, "samples": len(far)}
    return out


def _header(lengths: list[int], train_len: int, extra: list[str]) -> list[str]:
    """A table's heading row and rule: model, task, one column per length, then `extra`."""
    columns = ["model", "task", *(f"{n} ({n // train_len}x)" for n in lengths), *extra]
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def markdown(table: dict, copies: dict, lengths: list[int], train_len: int) -> str:
    rows = _header(lengths, train_len, ["copy probe: loss 1st / 2nd copy"])
    for model, scores in table.items():
        probe = f"{copies[model]['first']:.2f} / {copies[model]['second']:.2f}"
        for task in TASKS:
            cells = [scores[task].get(str(n)) for n in lengths]
            rows.append(f"| {model} | {task} | " + " | ".join("-" if c is None else f"{c:.0f}" for c in cells)
                        + f" | {probe} |")
    return "\n".join(rows)


def markdown_beyond(beyond: dict, lengths: list[int], train_len: int, reach: int) -> str:
    """The same table over the needles further back than `reach` (count of such samples)."""
    rows = [f"Needles ending more than {reach} tokens back (n_layers x window: beyond the stacked local windows), "
            "score (samples):", "", *_header(lengths, train_len, [])]
    for model, by_task in beyond.items():
        for task in TASKS:
            cells = [by_task[task].get(str(n)) for n in lengths]
            rows.append(f"| {model} | {task} | " + " | ".join(
                "-" if c is None or c["score"] is None else f"{c['score']:.0f} ({c['samples']})" for c in cells) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tfpp,swa,fs,fsl")
    parser.add_argument("--steps", type=int, default=None, help="override train.max_steps")
    parser.add_argument("--num-samples", type=int, default=10)
    parser.add_argument("--multiples", default="1,2,4,8,16")
    parser.add_argument("--out", default="runs/replicate")
    parser.add_argument("--skip-train", action="store_true", help="evaluate existing runs only")
    parser.add_argument("--config", default=str(CONFIG), help="the training config (all models)")
    parser.add_argument("--init-from", default=None,
                        help="train.init_from per model, '{model}' replaced by its name (e.g. runs/drill/{model}.pt)")
    parser.add_argument("overrides", nargs="*", help="training config overrides, e.g. optim.lr=1e-3")
    args = parser.parse_args()

    from fsframework.checkpoints import RunDir
    from fsframework.config import load_config

    config = Path(args.config).resolve()
    base = load_config(config, args.overrides)
    train_len = base.data.seq_len
    lengths = [train_len * int(m) for m in args.multiples.split(",")]
    out_root = REPO / args.out
    ensure_tokenizer(base.data.tokenizer, base.model.vocab_size)
    extra = [*args.overrides, *([f"train.max_steps={args.steps}"] if args.steps else [])]
    reach = base.model.n_layers * base.model.attention.window
    table, copies, timing, beyond = {}, {}, {}, {}
    for model in args.models.split(","):
        run_dir = out_root / model
        if not args.skip_train:
            init = [f"train.init_from={Path(args.init_from.format(model=model)).resolve()}"] if args.init_from else []
            timing[model] = train(config, model, run_dir, [*extra, *init])
        result = evaluate(run_dir, lengths, args.num_samples, RunDir(run_dir).eval_dir / "extrapolation.json")
        table[model], copies[model] = result["scores"], result["copy_probe"]
        beyond[model] = beyond_reach(result["samples"], reach)
    summary = {"config": str(config), "init_from": args.init_from, "train_len": train_len, "lengths": lengths,
               "scores": table, "copy_probe": copies, "window_reach": reach, "beyond_reach": beyond,
               "train_seconds": timing, "overrides": extra}
    (out_root / "table.json").write_text(json.dumps(summary, indent=1))
    text = markdown(table, copies, lengths, train_len) + "\n\n" + markdown_beyond(beyond, lengths, train_len, reach)
    (out_root / "table.md").write_text(text + "\n")
    print(text)
    for model, seconds in timing.items():
        print(f"{model}: trained in {seconds / 60:.1f} min")


if __name__ == "__main__":
    main()
