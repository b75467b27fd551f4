"""Where the RULER suite's time goes (docs/evaluation.md §4.1): per task and length, the seconds
per sample of making the prompts, of the prefill through the decode cache and of decoding the
task's tokens, on a checkpoint (or the random weights of a job YAML), and the slowest part.

    python tools/bench_ruler.py runs/quickstart --lengths 512,2048,8192 --samples 4
    python tools/bench_ruler.py --config yamls/quickstart.yaml --lengths 512 --samples 1 model.n_layers=1

Each (task, length) makes `--samples` prompts with `ruler_samples`, prefills them (one greedy
token) and decodes them whole (the task's generation budget, no stop at EOS, so every sample
costs what a model that never stops costs: the suite's worst case), batch `--batch-size`.
`per_task_s` is `per_sample_s` x `--suite-samples` (100: the paper's protocol), and the last
line the whole suite at each length at that count. QA reads `--ruler-data` (default: a fixture
written to a temporary folder). `--json` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time


def timed(fn):
    begin = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - begin


def load(args):
    import torch

    if args.checkpoint:
        from fsframework.checkpoints import Checkpoint, load_model

        model, cfg = load_model(Checkpoint.open(args.checkpoint), torch.device("cpu"), args.overrides)
        return model.eval(), cfg
    from fsframework.config import load_config
    from fsframework.models.registry import build_model

    cfg = load_config(args.config, args.overrides)
    torch.manual_seed(0)
    return build_model(cfg.model).eval(), cfg


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="yamls/quickstart.yaml")
    parser.add_argument("--lengths", default="512,2048,8192", help="comma-separated")
    parser.add_argument("--tasks", default=None, help="comma-separated (default: all 13)")
    parser.add_argument("--samples", type=int, default=2, help="samples timed per task and length")
    parser.add_argument("--suite-samples", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--ruler-data", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("rest", nargs="*", metavar="[CHECKPOINT] [key=value ...]",
                        help="a run or checkpoint directory (default: --config's random weights), config overrides")
    args = parser.parse_args(argv)
    args.lengths = [int(n) for n in args.lengths.split(",")]
    args.tasks = args.tasks.split(",") if args.tasks else None
    has_checkpoint = bool(args.rest) and "=" not in args.rest[0]
    args.checkpoint = args.rest[0] if has_checkpoint else None
    args.overrides = args.rest[1:] if has_checkpoint else args.rest

    from fsframework.data.tokenizers import load_tokenizer
    from fsframework.eval.decoding import greedy_generate
    from fsframework.eval.prompts import NaturalHaystack, PromptTooLong
    from fsframework.eval.qa_fixture import write_qa_fixture
    from fsframework.eval.ruler import RULER_TASKS, ruler_samples

    model, cfg = load(args)
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    data = args.ruler_data or str(write_qa_fixture(tempfile.mkdtemp(prefix="ruler-qa-"))["qa_1"].parent)
    haystack = NaturalHaystack(tokenizer, max_chars=max(300_000, 6 * max(args.lengths)))
    rows = []
    print(f"{'task':<16} {'length':>6} {'prompts s':>9} {'prefill s':>9} {'decode s':>9} {'s/sample':>9} "
          f"{'s/task':>8}  slowest part")
    for length in args.lengths:
        for task in args.tasks or list(RULER_TASKS):
            gen = RULER_TASKS[task].gen_tokens
            try:
                samples, make_s = timed(lambda: ruler_samples(task, tokenizer, length, args.samples, 0,
                                                              haystack=haystack, data_dir=data))
            except PromptTooLong as exc:
                print(f"{task:<16} {length:>6}  skipped: {exc}")
                continue
            prompts = [s.prompt for s in samples]
            _, prefill_s = timed(lambda: greedy_generate(model, prompts, 1, batch_size=args.batch_size))
            _, whole_s = timed(lambda: greedy_generate(model, prompts, gen, batch_size=args.batch_size))
            parts = {"prompts": make_s, "prefill": prefill_s, "decode": max(0.0, whole_s - prefill_s)}
            per_sample = (make_s + whole_s) / len(samples)
            row = {"task": task, "length": length, "samples": len(samples), "gen_tokens": gen,
                   **{f"{k}_s": v / len(samples) for k, v in parts.items()}, "per_sample_s": per_sample,
                   "per_task_s": per_sample * args.suite_samples, "slowest": max(parts, key=parts.get)}
            rows.append(row)
            print(f"{task:<16} {length:>6} {row['prompts_s']:>9.3f} {row['prefill_s']:>9.3f} {row['decode_s']:>9.3f} "
                  f"{per_sample:>9.3f} {row['per_task_s']:>8.1f}  {row['slowest']}")
    for length in args.lengths:
        at = [r for r in rows if r["length"] == length]
        if at:
            slowest = max(at, key=lambda r: r["per_task_s"])
            total = sum(r["per_task_s"] for r in at)
            print(f"suite at {length}: {len(at)} tasks x {args.suite_samples} samples ~ {total / 60:.1f} min; slowest "
                  f"task {slowest['task']} ({slowest['per_task_s']:.0f} s, mostly {slowest['slowest']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
