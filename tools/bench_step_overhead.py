"""What the per-step throughput figures and `train.profile` (off) cost a training step, side by side.

    python tools/bench_step_overhead.py            # the quickstart model, 20 steps each way

Times a tiny training loop (the quickstart model on random tokens, AdamW) three ways in one
process, alternating rounds so drift hits all alike: the bare loop; the loop with the trainer's
step clock and the profiler's hooks with profiling off (`fsframework.train.throughput`,
`fsframework.train.profiling`); and the same plus one logged step's record each step (peak
memory read, FLOPs per token). Prints the median step time of each and the ratios to the bare
loop. A ratio within the rounds' spread is no measurable slowdown.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from fsframework.config import load_config
from fsframework.models.flops import training_flops_per_token
from fsframework.models.registry import build_model
from fsframework.train.profiling import StepProfiler
from fsframework.train.throughput import StepClock, peak_memory_mb, step_record

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per round and way")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=256)
    args = parser.parse_args()
    if args.steps * args.rounds < 2:
        parser.error("--steps x --rounds must be at least 2: the bare loop's spread needs two step times")
    torch.set_num_threads(1)
    cfg = load_config(REPO / "yamls" / "quickstart.yaml", [f"data.seq_len={args.seq_len}"])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, cfg.model.vocab_size, (2, args.seq_len + 1))
    clock, device = StepClock(), torch.device("cpu")
    profiler = StepProfiler(cfg.train.profile, 0, Path("/nonexistent"), device)  # off: steps 0
    flops = training_flops_per_token(cfg.model, args.seq_len)

    def step(way: str, n: int) -> float:
        start = time.perf_counter()
        if way != "bare":
            profiler.before_step(n)
            clock.start()
            clock.lap("data")
        loss = model(tokens[:, :-1], targets=tokens[:, 1:]).mean()
        loss.backward()
        if way != "bare":
            clock.lap("compute")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if way != "bare":
            clock.lap("optimizer")
            profiler.after_step(n)
        elapsed = time.perf_counter() - start
        if way == "logged":
            step_record(elapsed=elapsed, phases=clock.phases, tokens=tokens.numel(), flops_per_token=flops,
                        world_size=1, peak_tflops=None, memory=peak_memory_mb(device))
        return time.perf_counter() - start

    ways = ("bare", "clocked", "logged")
    times: dict[str, list[float]] = {way: [] for way in ways}
    for way in ways:
        step(way, 0)  # warm-up
    for _ in range(args.rounds):
        for way in ways:
            times[way] += [step(way, i + 1) for i in range(args.steps)]
    base = statistics.median(times["bare"])
    spread = (statistics.quantiles(times["bare"], n=4)[2] - statistics.quantiles(times["bare"], n=4)[0]) / base
    print(f"quickstart model, {args.seq_len} tokens x 2 rows, {args.rounds} rounds x {args.steps} steps, 1 thread")
    for way in ways:
        median = statistics.median(times[way])
        print(f"{way:8s} median step {median * 1e3:8.2f} ms  ratio to bare {median / base:.4f}")
    print(f"bare loop's interquartile spread: {spread:.2%} of its median")


if __name__ == "__main__":
    main()
