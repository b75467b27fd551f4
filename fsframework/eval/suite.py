"""Run long-context evaluation tasks over several lengths: scores, a table, JSON and plots.

Tasks: the eight RULER NIAH tasks, "passkey", "ffact", "perplexity" and "mqar" (docs/evaluation.md).
Scores are 0-100 (RULER string_match_all for NIAH, exact match for passkey, value
found for F-fact); perplexity is reported as is. `ruler_mean` averages the NIAH
tasks that ran at each length.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from torch import nn

from fsframework.data.mixture import HeldOutStream
from fsframework.eval import decoding
from fsframework.eval.ffact import FACT_COUNTS, FFACT_GEN_TOKENS, ffact_samples, queries_per_prefix
from fsframework.eval.mqar import mqar_scores
from fsframework.eval.passkey import PASSKEY_GEN_TOKENS, passkey_samples
from fsframework.eval.perplexity import PERPLEXITY_TASKS, document_perplexity, perplexity_vs_length
from fsframework.eval.ruler import NIAH_GEN_TOKENS, RULER_TASKS, NaturalHaystack, PromptTooLong, niah_samples
from fsframework.eval.scoring import mean, passkey_match, postprocess_pred, sample_match_all

TASKS = (*RULER_TASKS, "passkey", "ffact", "perplexity", "doc_perplexity", "mqar")
UNPROMPTED = ("perplexity", "doc_perplexity", "mqar")  # scored from one forward pass, not from generated text
HELDOUT_TASKS = PERPLEXITY_TASKS  # read the run's held-out split
DEFAULT_GEN_TOKENS = {**{t: NIAH_GEN_TOKENS for t in RULER_TASKS}, "passkey": PASSKEY_GEN_TOKENS,
                      "ffact": FFACT_GEN_TOKENS}


def validate_tasks(tasks: list[str], lengths: list[int]) -> None:
    if not tasks:
        raise ValueError(f"no tasks given; choose from: {', '.join(TASKS)}")
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise ValueError(f"unknown task(s) {', '.join(map(repr, unknown))}; allowed tasks: {', '.join(TASKS)}")
    if not lengths or any(int(n) <= 0 for n in lengths):
        raise ValueError(f"lengths must be positive integers, got {lengths}")


def _haystack_chars(lengths: list[int]) -> int:
    # enough prose that long prompts rarely wrap around the text (~6 chars per token covers
    # byte and subword tokenizers), but small runs do not parse all docstrings
    return int(min(2_000_000, max(300_000, 6 * max(lengths))))


def _samples(task: str, tokenizer, length: int, num_samples: int, seed: int, gen: int, haystack):
    """(samples, per-sample group key, skipped sub-conditions) for one task and length."""
    if task == "passkey":
        samples = passkey_samples(tokenizer, length, num_samples, seed, gen_tokens=gen, haystack=haystack)
        return samples, [f"{s.meta['depth']:g}" for s in samples], {}
    if task == "ffact":
        by_count, skipped = ffact_samples(tokenizer, length, num_samples, seed, gen_tokens=gen, haystack=haystack)
        samples = [s for count in sorted(by_count) for s in by_count[count]]
        return samples, [str(s.meta["facts"]) for s in samples], skipped
    samples = niah_samples(task, tokenizer, length, num_samples, seed, gen_tokens=gen, haystack=haystack)
    return samples, [None] * len(samples), {}


def _score(task: str, prediction: str, answers: list[str]) -> float:
    if task == "passkey":
        return passkey_match(prediction, answers[0])
    return sample_match_all(prediction, answers)


def _expected_prompts(task: str, num_samples: int) -> int:
    if task == "ffact":
        return num_samples * sum(queries_per_prefix(c) for c in FACT_COUNTS)
    return num_samples


def _run_task(task, model, tokenizer, lengths, num_samples, seed, batch_size, gen, haystack, device, advance,
              results):
    scores, groups_out, records_out = {}, {}, {}
    for length in lengths:
        key = str(length)
        try:
            samples, groups, skipped = _samples(task, tokenizer, length, num_samples, seed, gen, haystack)
        except PromptTooLong as exc:
            scores[key] = None
            results["skipped"].setdefault(task, {})[key] = str(exc)
            advance(_expected_prompts(task, num_samples))
            continue
        for count, reason in skipped.items():
            results["skipped"].setdefault(task, {})[f"{key}/F={count}"] = reason
            advance(num_samples * queries_per_prefix(count))
        outputs = decoding.greedy_generate(model, [s.prompt for s in samples], gen, eos_id=tokenizer.eos_id,
                                           batch_size=batch_size, device=device, on_batch=advance)
        records, by_group = [], {}
        for sample, group, out in zip(samples, groups, outputs):
            prediction = postprocess_pred(tokenizer.decode(out))
            score = _score(task, prediction, sample.answers)
            by_group.setdefault(group, []).append(score)
            records.append({**sample.meta, "answers": sample.answers, "prediction": prediction, "score": score})
        scores[key] = mean([r["score"] for r in records])
        if task in ("passkey", "ffact"):
            groups_out[key] = {g: mean(v) for g, v in by_group.items()}
        records_out[key] = records
    results["scores"][task] = scores
    if groups_out:
        results["breakdown"][task] = groups_out
    results["samples"][task] = records_out


def _run_document_perplexity(model, tokenizer, lengths, num_samples, batch_size, data_dir, device, results):
    """Perplexity on held-out documents at least as long as each length (`document_perplexity`), of the
    first held-out stream; the number of documents per length goes to `breakdown`."""
    location = data_dir if isinstance(data_dir, str) else list(data_dir)[0].location
    values = document_perplexity(model, tokenizer, list(lengths), data_dir=location, num_samples=num_samples,
                                 batch_size=batch_size, device=device)
    scores, floors, counts = {}, {}, {}
    for n in lengths:
        score = values[n]
        scores[str(n)] = _finite(score.perplexity)
        floors[str(n)] = _finite(score.floor)
        counts[str(n)] = score.count
        if not score.count:
            results["skipped"].setdefault("doc_perplexity", {})[str(n)] = f"no held-out document of {n + 1} tokens"
    results["scores"]["doc_perplexity"] = scores
    results["scores"]["doc_perplexity_floor"] = floors
    results["breakdown"]["doc_perplexity"] = {"documents": counts}


def _finite(value: float) -> float | None:
    """NaN (nothing read) is not valid JSON: None."""
    return value if math.isfinite(value) else None


def _run_perplexity(model, tokenizer, lengths, num_samples, batch_size, data_dir, device, results):
    """Perplexity per length of every held-out stream (`data_dir`: one MDS split, or the run's
    `HeldOutStream`s), and of their mixture (`mixture_perplexity`) as the task's score; with
    several streams each one's values go to `breakdown["perplexity"][label]`."""
    streams = [HeldOutStream("data", 1.0, data_dir)] if isinstance(data_dir, str) else list(data_dir)
    # num_samples sequences per length, in batches of batch_size
    num_batches = max(1, math.ceil(num_samples / batch_size))
    per_stream = {s.label: perplexity_vs_length(model, tokenizer, list(lengths), data_dir=s.location,
                                                num_batches=num_batches, batch_size=batch_size, device=device)
                  for s in streams}
    scores, floors = {}, {}
    weights = {s.label: s.weight for s in streams}
    for n in lengths:
        values = {s.label: per_stream[s.label][n].perplexity for s in streams}
        # no full window of held-out text at this length: None (NaN is not valid JSON)
        scores[str(n)] = _finite(mixture_perplexity(values, weights))
        floors[str(n)] = _finite(mixture_perplexity({s.label: per_stream[s.label][n].floor for s in streams}, weights))
        missing = [label for label, v in values.items() if not math.isfinite(v)]
        if len(streams) == 1 and missing:
            results["skipped"].setdefault("perplexity", {})[str(n)] = "no full window of held-out text"
        elif missing:
            results["skipped"].setdefault("perplexity", {})[str(n)] = (
                f"no full window of held-out text in {', '.join(missing)}"
                + ("" if len(missing) == len(streams) else ": the mixture weighs the other streams"))
    results["scores"]["perplexity"] = scores
    results["scores"]["perplexity_floor"] = floors
    if len(streams) > 1:
        results["breakdown"]["perplexity"] = {label: {str(n): _finite(ppl[n].perplexity) for n in lengths}
                                              for label, ppl in per_stream.items()}


def mixture_perplexity(values: dict[str, float], weights: dict[str, float]) -> float:
    """exp of the streams' mean token log-losses weighted as the mixture (validation's `val/loss`,
    as a perplexity): `exp(sum_s w_s log ppl_s)`, over the streams with a value (NaN: no window
    at this length), their weights renormalised; NaN when none has one. One stream: its value."""
    finite = {label: v for label, v in values.items() if math.isfinite(v)}
    if not finite:
        return float("nan")
    if len(values) == 1:
        return next(iter(finite.values()))
    total = sum(weights[label] for label in finite)
    return math.exp(sum(weights[label] * math.log(v) for label, v in finite.items()) / total)


def _run_mqar(model, spec, reach, lengths, num_samples, seed, batch_size, device, advance, results):
    if spec is None:
        raise ValueError("task 'mqar' needs the run's data.mqar sizes (mqar=...)")
    scores, floors, in_row, breakdown = {}, {}, {}, {}
    for length in lengths:
        found = mqar_scores(model, spec, length, num_samples, seed, batch_size, reach, device)
        scores[str(length)] = found.pop("score")
        floors[str(length)] = found.pop("floor")
        in_row[str(length)] = found.pop("in_row")
        breakdown[str(length)] = found
        advance(1)
    # the floor and the in-row rate beside the accuracy: association is accuracy above the floor
    results["scores"].update({"mqar": scores, "mqar_floor": floors, "mqar_in_row": in_row})
    results["breakdown"]["mqar"] = breakdown


def print_table(results: dict, console: Console | None = None) -> Table:
    """Rich table: one row per task (F-fact also per fact count), one column per length."""
    lengths = [str(n) for n in results["meta"]["lengths"]]
    table = Table(title="Long-context evaluation")
    table.add_column("task")
    for n in lengths:
        table.add_column(n, justify="right")

    def cell(value, digits=1):
        return "-" if value is None else f"{value:.{digits}f}"

    for task, series in results["scores"].items():
        digits = 2 if task.removesuffix("_floor") in HELDOUT_TASKS else 1
        table.add_row(task, *(cell(series.get(n), digits) for n in lengths))
        if task == "perplexity":  # a mixture's streams, each on its own held-out text
            for stream, values in results["breakdown"].get("perplexity", {}).items():
                table.add_row(f"  {stream}", *(cell(values.get(n), digits) for n in lengths))
        if task == "doc_perplexity":
            counts = results["breakdown"].get("doc_perplexity", {}).get("documents", {})
            table.add_row("  documents", *(str(counts.get(n, 0)) for n in lengths))
        if task == "mqar":
            for split in ("within", "beyond"):
                for name, key in ((f"  {split} reach", split), ("    its floor", f"{split}_floor")):
                    table.add_row(name, *(cell(results["breakdown"]["mqar"].get(n, {}).get(key)) for n in lengths))
        if task == "ffact":
            for count in FACT_COUNTS:
                table.add_row(f"  F={count}", *(cell(results["breakdown"].get("ffact", {}).get(n, {}).get(str(count)))
                                                 for n in lengths))
    if results.get("ruler_mean"):
        table.add_row("RULER mean", *(cell(results["ruler_mean"].get(n)) for n in lengths), style="bold")
    (console or Console()).print(table)
    return table


def run_eval(model, tokenizer, *, tasks: list[str], lengths: list[int], num_samples: int, seed: int,
             batch_size: int, out_path: str | None, plots_dir: str | None, data_dir, device,
             gen_tokens: dict[str, int] | None = None, console: Console | None = None,
             progress_callback: Callable[[str, int], None] | None = None, meta: dict | None = None,
             mqar=None, mqar_reach: int = 0) -> dict:
    """Run `tasks` at every length in `lengths` and return the result dict.

    `num_samples` is samples per task and length (F-fact: prefixes per fact count;
    perplexity: sequences per length). `gen_tokens` overrides the generation budget per
    task (defaults: RULER's 128 for NIAH, 16 for passkey and F-fact). A length too
    short for a task's fixed prompt is skipped with its reason under `skipped`.
    `data_dir` is what perplexity reads: one held-out MDS split, or the run's streams
    (`fsframework.data.mixture.heldout_streams`), scored each and as their mixture.
    `mqar` (a `MqarConfig`, the run's `data.mqar`) and `mqar_reach` (the stacked windows' reach
    in tokens) are what the "mqar" task needs. Writes `out_path` (JSON with scores and
    per-sample records) and PNGs under `plots_dir` when given. `meta` (e.g. the checkpoint and its read path) joins the file's "meta".
    """
    validate_tasks(tasks, lengths)
    heldout = [task for task in tasks if task in HELDOUT_TASKS]
    if heldout and not data_dir:
        raise ValueError(f"task {heldout[0]!r} needs data_dir (the evaluation MDS dataset)")
    if num_samples < 1 or batch_size < 1:
        raise ValueError(f"num_samples and batch_size must be >= 1, got {num_samples} and {batch_size}")
    lengths = sorted({int(n) for n in lengths})
    gen = {**DEFAULT_GEN_TOKENS, **(gen_tokens or {})}
    console = console or Console()
    results = {"meta": {"tasks": list(tasks), "lengths": lengths, "num_samples": num_samples, "seed": seed,
                        "batch_size": batch_size, "tokenizer": getattr(tokenizer, "name", type(tokenizer).__name__),
                        "gen_tokens": {t: gen[t] for t in tasks if t in gen}, **(meta or {})},
               "scores": {}, "breakdown": {}, "skipped": {}, "ruler_mean": {}, "samples": {}}
    haystack = None
    if any(t not in UNPROMPTED and t != "niah_single_1" for t in tasks):
        haystack = NaturalHaystack(tokenizer, max_chars=_haystack_chars(lengths))
    was_training = isinstance(model, nn.Module) and model.training  # None: a test's stand-in
    if isinstance(model, nn.Module):
        model.eval()
    try:
        with Progress(TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as progress:
            for task in tasks:
                total = len(lengths) if task in UNPROMPTED else _expected_prompts(task, num_samples) * len(lengths)
                bar = progress.add_task(task, total=total)

                def advance(n: int, _bar=bar, _task=task) -> None:
                    progress.advance(_bar, n)
                    if progress_callback is not None:
                        progress_callback(_task, n)

                if task == "perplexity":
                    _run_perplexity(model, tokenizer, lengths, num_samples, batch_size, data_dir, device, results)
                    advance(len(lengths))
                elif task == "doc_perplexity":
                    _run_document_perplexity(model, tokenizer, lengths, num_samples, batch_size, data_dir, device,
                                             results)
                    advance(len(lengths))
                elif task == "mqar":
                    _run_mqar(model, mqar, mqar_reach, lengths, num_samples, seed, batch_size, device, advance,
                              results)
                else:
                    _run_task(task, model, tokenizer, lengths, num_samples, seed, batch_size, gen[task], haystack,
                              device, advance, results)
    finally:
        if was_training:
            model.train()
    niah = [t for t in tasks if t in RULER_TASKS]
    for n in map(str, lengths):
        values = [results["scores"][t][n] for t in niah if results["scores"][t].get(n) is not None]
        if values:
            results["ruler_mean"][n] = mean(values)
    print_table(results, console)
    if plots_dir:
        from fsframework.eval.plots import write_plots  # matplotlib takes ~1 s to import: only for plots

        results["plots"] = write_plots(results, plots_dir)
    if out_path:
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        Path(out_path).write_text(json.dumps(results, indent=1))
    return results
