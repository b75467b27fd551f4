"""Run long-context evaluation tasks over several lengths: scores, a table, JSON and plots.

Tasks: the 13 RULER tasks ("ruler" stands for all of them), "passkey", "ffact", "perplexity",
"doc_perplexity" and "mqar" (docs/evaluation.md). Scores are 0-100 (RULER's string_match_all,
string_match_part for QA; exact match for passkey, value found for F-fact); perplexity is
reported as is. `ruler_mean` is the paper's suite mean over the RULER tasks that ran at each
length, and `ruler_mean_tasks` says how many of the suite's 12 (13 from `qa2_from` on) it covers.
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
from fsframework.eval.prompts import NaturalHaystack, PromptTooLong
from fsframework.config.evaluation import EvalConfig
from fsframework.eval.ruler import (QA2_FROM, QA_TASKS, RULER_TASKS, SUITE, check_qa_files, ruler_samples, score_sample,
                                    suite_mean)
from fsframework.eval.ruler_floors import sample_floor
from fsframework.eval.scoring import mean, passkey_match, postprocess_pred, sample_match_all

TASKS = (*RULER_TASKS, "passkey", "ffact", "perplexity", "doc_perplexity", "mqar")
FAIL_BELOW = EvalConfig.ruler_fail_below  # --stop-after-failure: the S-NIAH mean under which a model has failed
S_NIAH = ("niah_single_1", "niah_single_2", "niah_single_3")
UNPROMPTED = ("perplexity", "doc_perplexity", "mqar")  # scored from one forward pass, not from generated text
HELDOUT_TASKS = PERPLEXITY_TASKS  # read the run's held-out split
DEFAULT_GEN_TOKENS = {**{t: spec.gen_tokens for t, spec in RULER_TASKS.items()}, "passkey": PASSKEY_GEN_TOKENS,
                      "ffact": FFACT_GEN_TOKENS}


def validate_tasks(tasks: list[str], lengths: list[int]) -> None:
    if not tasks:
        raise ValueError(f"no tasks given; choose from: {', '.join((SUITE, *TASKS))}")
    unknown = [t for t in tasks if t not in TASKS and t != SUITE]
    if unknown:
        raise ValueError(f"unknown task(s) {', '.join(map(repr, unknown))}; allowed tasks: {', '.join((SUITE, *TASKS))}")
    if not lengths or any(int(n) <= 0 for n in lengths):
        raise ValueError(f"lengths must be positive integers, got {lengths}")


def expand_tasks(tasks: list[str], ruler_data) -> tuple[list[str], str | None]:
    """`tasks` with "ruler" replaced by the suite's 13 tasks (without QA when `ruler_data` is not
    given: then the second value is the one line that says so), in order, each once. A QA task
    it will run without its file is an error naming the file (`check_qa_files`)."""
    check_qa_files(tasks, ruler_data)
    out, note = [], None
    for task in tasks:
        if task == SUITE:
            names = list(RULER_TASKS)
            if not ruler_data:
                names = [t for t in names if t not in QA_TASKS]
                note = ("ruler: qa_1 and qa_2 left out: they read SQuAD's dev-v2.0.json and HotpotQA's "
                        "hotpot_dev_distractor_v1.json from --ruler-data DIR (docs/evaluation.md §4.1)")
            out.extend(n for n in names if n not in out)
        elif task not in out:
            out.append(task)
    return out, note


def _haystack_chars(lengths: list[int]) -> int:
    # enough prose that long prompts rarely wrap around the text (~6 chars per token covers
    # byte and subword tokenizers), but small runs do not parse all docstrings
    return int(min(2_000_000, max(300_000, 6 * max(lengths))))


def _samples(task: str, tokenizer, length: int, num_samples: int, seed: int, gen: int, haystack, ruler_data):
    """(samples, per-sample group key, skipped sub-conditions) for one task and length."""
    if task == "passkey":
        samples = passkey_samples(tokenizer, length, num_samples, seed, gen_tokens=gen, haystack=haystack)
        return samples, [f"{s.meta['depth']:g}" for s in samples], {}
    if task == "ffact":
        by_count, skipped = ffact_samples(tokenizer, length, num_samples, seed, gen_tokens=gen, haystack=haystack)
        samples = [s for count in sorted(by_count) for s in by_count[count]]
        return samples, [str(s.meta["facts"]) for s in samples], skipped
    samples = ruler_samples(task, tokenizer, length, num_samples, seed, gen_tokens=gen, haystack=haystack,
                            data_dir=ruler_data)
    return samples, [None] * len(samples), {}


def _score(task: str, prediction: str, answers: list[str]) -> float:
    if task == "passkey":
        return passkey_match(prediction, answers[0])
    if task in RULER_TASKS:
        return score_sample(task, prediction, answers)
    return sample_match_all(prediction, answers)


def _expected_prompts(task: str, num_samples: int) -> int:
    if task == "ffact":
        return num_samples * sum(queries_per_prefix(c) for c in FACT_COUNTS)
    return num_samples


def _run_task_at(task, length, model, tokenizer, num_samples, seed, batch_size, gen, haystack, ruler_data, device,
                 advance, results):
    """Generate, decode and score `task` at one length into `results`."""
    key = str(length)
    try:
        samples, groups, skipped = _samples(task, tokenizer, length, num_samples, seed, gen, haystack, ruler_data)
    except PromptTooLong as exc:
        results["scores"][task][key] = None
        results["skipped"].setdefault(task, {})[key] = str(exc)
        advance(_expected_prompts(task, num_samples))
        return
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
        record = {**sample.meta, "answers": sample.answers, "prediction": prediction, "score": score}
        if task in RULER_TASKS:
            record["floor"] = round(sample_floor(task, tokenizer.decode(sample.prompt), sample.answers), 2)
        records.append(record)
    results["scores"][task][key] = mean([r["score"] for r in records])
    if task in RULER_TASKS:
        results["ruler_floor"].setdefault(task, {})[key] = mean([r["floor"] for r in records])
    if task in ("passkey", "ffact"):
        results["breakdown"].setdefault(task, {})[key] = {g: mean(v) for g, v in by_group.items()}
    zero_shot = sum(1 for r in records if r.get("one_shot") is False)
    if zero_shot:  # vt / cwe at a length without room for RULER's one-shot example
        results["notes"].setdefault(task, {})[key] = (f"{zero_shot} of {len(records)} samples zero-shot: no room "
                                                      "for RULER's one-shot example")
    results["samples"].setdefault(task, {})[key] = records


def failed_at(results: dict, length: int, fail_below: float) -> str | None:
    """Why a model has failed at `length` (--stop-after-failure), or None: the mean of the S-NIAH
    tasks that ran there is below `fail_below`."""
    values = [results["scores"][t].get(str(length)) for t in S_NIAH if t in results["scores"]]
    values = [v for v in values if v is not None]
    if values and sum(values) / len(values) < fail_below:
        return f"failed at {length}: S-NIAH mean {sum(values) / len(values):.1f} < {fail_below:g}"
    return None


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
    table = Table(title="Long-context evaluation", caption="RULER tasks: score (floor: the same prompts answered "
                  "with items of the answer's kind drawn from the prompt)" if results.get("ruler_floor") else None)
    table.add_column("task")
    for n in lengths:
        table.add_column(n, justify="right")

    def cell(value, digits=1):
        return "-" if value is None else f"{value:.{digits}f}"

    floors = results.get("ruler_floor", {})
    for task, series in results["scores"].items():
        digits = 2 if task.removesuffix("_floor") in HELDOUT_TASKS else 1
        if task in floors:  # a RULER task: its score and, in parentheses, its floor
            table.add_row(task, *(with_floor(series.get(n), floors[task].get(n)) for n in lengths))
            continue
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
        covered = results.get("ruler_mean_tasks", {})
        floor = results.get("ruler_mean_floor", {})
        table.add_row("RULER mean", *(with_floor(results["ruler_mean"].get(n), floor.get(n)) for n in lengths),
                      style="bold")
        table.add_row("  tasks averaged", *(f"{covered[n]['tasks']} of {covered[n]['of']}" if n in covered else "-"
                                            for n in lengths))
    console = console or Console()
    console.print(table)
    for line in summary_lines(results):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    return table


def with_floor(value, floor) -> str:
    """A RULER cell: the score and its floor, "12.0 (50.0)"."""
    if value is None:
        return "-"
    return f"{value:.1f}" + ("" if floor is None else f" ({floor:.1f})")


def summary_lines(results: dict) -> list[str]:
    """One line per length whose RULER mean is not the whole suite's (which tasks it lacks),
    and one per task whose lengths were skipped or ran with a note."""
    lines = []
    for n, covered in results.get("ruler_mean_tasks", {}).items():
        if covered["missing"]:
            lines.append(f"RULER mean at {n} averages {covered['tasks']} of the suite's {covered['of']} tasks "
                         f"(not the suite mean): missing {', '.join(covered['missing'])}")
    for task, by_length in results.get("skipped", {}).items():
        for n, reason in by_length.items():
            lines.append(f"{task} at {n} skipped: {reason}")
    for task, by_length in results.get("notes", {}).items():
        if isinstance(by_length, dict):
            lines.extend(f"{task} at {n}: {note}" for n, note in by_length.items())
        else:  # the suite's own note (QA left out)
            lines.append(by_length)
    return lines


def run_eval(model, tokenizer, *, tasks: list[str], lengths: list[int], num_samples: int, seed: int,
             batch_size: int, out_path: str | None, plots_dir: str | None, data_dir, device,
             gen_tokens: dict[str, int] | None = None, console: Console | None = None,
             progress_callback: Callable[[str, int], None] | None = None, meta: dict | None = None,
             mqar=None, mqar_reach: int = 0, ruler_data=None, stop_after_failure: bool = False,
             fail_below: float = FAIL_BELOW, qa2_from: int = QA2_FROM) -> dict:
    """Run `tasks` at every length in `lengths` and return the result dict.

    `num_samples` is samples per task and length (F-fact: prefixes per fact count;
    perplexity: sequences per length). `gen_tokens` overrides the generation budget per
    task (defaults: RULER's per task, 16 for passkey and F-fact). A length too
    short for a task's fixed prompt is skipped with its reason under `skipped`.
    "ruler" in `tasks` stands for the 13 RULER tasks (`expand_tasks`); `ruler_data` is the folder
    of the QA tasks' official files. The prompted tasks run length by length, shortest first;
    with `stop_after_failure`, once the S-NIAH mean at a length is below `fail_below` the longer
    lengths are skipped (`failed_at`), as the FreeSolo paper's protocol omits them. `ruler_mean`
    covers the suite's 12 tasks below `qa2_from` and 13 from it on (`suite_mean`).
    `data_dir` is what perplexity reads: one held-out MDS split, or the run's streams
    (`fsframework.data.mixture.heldout_streams`), scored each and as their mixture.
    `mqar` (a `MqarConfig`, the run's `data.mqar`) and `mqar_reach` (the stacked windows' reach
    in tokens) are what the "mqar" task needs. Writes `out_path` (JSON with scores and
    per-sample records) and PNGs under `plots_dir` when given. `meta` (e.g. the checkpoint and its read path) joins the file's "meta".
    """
    validate_tasks(tasks, lengths)
    tasks, suite_note = expand_tasks(tasks, ruler_data)
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
                        "gen_tokens": {t: gen[t] for t in tasks if t in gen}, "qa2_from": qa2_from,
                        "stop_after_failure": fail_below if stop_after_failure else None, **(meta or {})},
               "scores": {}, "breakdown": {}, "skipped": {}, "notes": {}, "ruler_mean": {}, "ruler_mean_tasks": {},
               "ruler_floor": {}, "ruler_mean_floor": {},
               "samples": {}}
    if suite_note:
        results["notes"]["ruler"] = suite_note
        console.print(suite_note, markup=False, highlight=False, soft_wrap=True)
    haystack = None
    if any(t not in UNPROMPTED and t != "niah_single_1" for t in tasks):
        haystack = NaturalHaystack(tokenizer, max_chars=_haystack_chars(lengths))
    prompted = [t for t in tasks if t not in UNPROMPTED]
    was_training = isinstance(model, nn.Module) and model.training  # None: a test's stand-in
    if isinstance(model, nn.Module):
        model.eval()
    try:
        with Progress(TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as progress:
            advances = {}
            for task in tasks:
                total = len(lengths) if task in UNPROMPTED else _expected_prompts(task, num_samples) * len(lengths)
                bar = progress.add_task(task, total=total)

                def advance(n: int, _bar=bar, _task=task) -> None:
                    progress.advance(_bar, n)
                    if progress_callback is not None:
                        progress_callback(_task, n)

                advances[task] = advance
                results["scores"][task] = {}
                if task not in UNPROMPTED:
                    results["samples"][task] = {}  # per length, the records of the lengths that ran
            failure = None
            for length in lengths:  # the prompted tasks, shortest length first
                for task in prompted:
                    if failure:
                        results["scores"][task][str(length)] = None
                        results["skipped"].setdefault(task, {})[str(length)] = f"not run: the model {failure}"
                        advances[task](_expected_prompts(task, num_samples))
                        continue
                    _run_task_at(task, length, model, tokenizer, num_samples, seed, batch_size, gen[task], haystack,
                                 ruler_data, device, advances[task], results)
                if stop_after_failure and not failure:
                    failure = failed_at(results, length, fail_below)
            for task in tasks:
                if task == "perplexity":
                    _run_perplexity(model, tokenizer, lengths, num_samples, batch_size, data_dir, device, results)
                    advances[task](len(lengths))
                elif task == "doc_perplexity":
                    _run_document_perplexity(model, tokenizer, lengths, num_samples, batch_size, data_dir, device,
                                             results)
                    advances[task](len(lengths))
                elif task == "mqar":
                    _run_mqar(model, mqar, mqar_reach, lengths, num_samples, seed, batch_size, device,
                              advances[task], results)
    finally:
        if was_training:
            model.train()
    # each task in the order asked, its floors (perplexity_floor, mqar_floor, ...) right after it
    results["scores"] = {k: v for t in tasks for k, v in results["scores"].items()
                         if k == t or (k.startswith(t + "_") and k not in tasks)}
    results["ruler_mean"], results["ruler_mean_tasks"] = suite_mean(results["scores"], lengths, qa2_from)
    results["ruler_mean_floor"], _ = suite_mean(results["ruler_floor"], lengths, qa2_from)
    print_table(results, console)
    if plots_dir:
        from fsframework.eval.plots import write_plots  # matplotlib takes ~1 s to import: only for plots

        results["plots"] = write_plots(results, plots_dir)
    if out_path:
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        Path(out_path).write_text(json.dumps(results, indent=1))
    return results
