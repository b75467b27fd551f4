"""Evaluate a checkpoint: load it, pick the data and tokenizer of its run, run the suite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
from rich.console import Console
from rich.table import Table

from fsframework.checkpoints import Checkpoint, RunDir, load_model, training_step
from fsframework.config.kinds import kind_facts
from fsframework.data.mixture import heldout_streams
from fsframework.data.tokenizers import load_tokenizer
from fsframework.eval.ruler import check_qa_files
from fsframework.eval.suite import run_eval
from fsframework.eval.tensorboard import log_eval_results  # tensorboard itself is imported when it writes


def evaluate_checkpoint(checkpoint: Path, *, tasks: list[str], lengths: Optional[list[int]], num_samples: int,
                        batch_size: Optional[int], seed: int, out: Optional[Path], overrides: list[str],
                        name: Optional[str] = None, ruler_data: Optional[Path] = None,
                        stop_after_failure: Optional[bool] = None) -> dict:
    """Evaluate `checkpoint` (run, checkpoint or export); scores to `out`, and to the run's
    tensorboard under `eval/<label>/...` (`eval_label`; `name` replaces the label). `ruler_data`
    and `stop_after_failure` replace the config's `eval.ruler_data` / `eval.stop_after_failure`."""
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    ckpt = Checkpoint.open(checkpoint)  # resolved and verified once
    job = ckpt.config(overrides)
    settings = job.eval
    ruler_data = str(ruler_data) if ruler_data is not None else settings.ruler_data
    check_qa_files(tasks, ruler_data)  # a QA task without its file fails before the model loads
    # held-out text is needed (and, for the embedded corpus, built) only for perplexity: every
    # stream's, found (or found missing) before the model is loaded
    data_dir = heldout_streams(job) if {"perplexity", "doc_perplexity"} & set(tasks) else None
    model, cfg = load_model(ckpt, device, overrides)
    out = out or ckpt.run.scores
    out.parent.mkdir(parents=True, exist_ok=True)
    results = run_eval(model, load_tokenizer(cfg.data.tokenizer), tasks=tasks,
                       lengths=lengths or list(cfg.eval.lengths), num_samples=num_samples, seed=seed,
                       batch_size=batch_size or cfg.eval.batch_size, out_path=str(out), plots_dir=str(out.parent),
                       data_dir=data_dir,
                       device=device, meta={"checkpoint": str(ckpt.path), "read_path": read_path(model, cfg)},
                       mqar=cfg.data.mqar, mqar_reach=cfg.model.n_layers * cfg.model.attention.window,
                       ruler_data=ruler_data, qa2_from=settings.ruler_qa2_from, fail_below=settings.ruler_fail_below,
                       stop_after_failure=settings.stop_after_failure if stop_after_failure is None
                       else stop_after_failure)
    if cfg.train.tensorboard:  # beside the run's training curves, at the checkpoint's step
        log_eval_results(ckpt.run.tensorboard, results, checkpoint_step(ckpt.path),
                         label=name or eval_label(read_path(model, cfg), num_samples))
    return results


def checkpoint_step(ckpt: Path) -> int:
    """The optimizer step of checkpoint folder `step_NNNNNNNN`, or the one an export records (0 else)."""
    return training_step(ckpt)


def eval_label(path: dict, num_samples: int) -> str:
    """What an evaluation read, as a tensorboard tag part: the kind, its read path's settings (FS's
    top_k, FS-B's search) and the sample count, e.g. `fsb-top_k4-beam_width16-bound_c8.0-forests_both-n10`;
    evaluations that differ in any of them log apart instead of over each other."""
    parts = [path["model"]] + [f"{key}{'_' if isinstance(value, str) else ''}{value}"
                               for key, value in path.items() if key not in ("model", "tau_file")]
    return "-".join(parts + [f"n{num_samples}"])


def read_path(model, cfg) -> dict:
    """How the model reads long range, for the scores file: the kind, and FS-B's search and tau file."""
    kind = kind_facts(cfg.model.name)
    path = kind.read_path(cfg.model.attention)
    if kind.calibrated:
        path["tau_file"] = model.fsb_calibration_file
    return path


def summary_table(run_dir: Path, scores: dict) -> None:
    """The main job's closing table: training loss first/last, throughput, eval scores."""
    records = [json.loads(line) for line in RunDir(run_dir).metrics.read_text().splitlines() if line.strip()]
    table = Table(title=f"summary of {run_dir}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    if records:
        table.add_row("steps", str(records[-1]["step"]))
        table.add_row("tokens", f"{records[-1]['tokens']:,}")
        table.add_row("loss (first step)", f"{records[0]['loss']:.4f}")
        table.add_row("loss (last step)", f"{records[-1]['loss']:.4f}")
        tps = sorted(r["tokens_per_s"] for r in records)
        table.add_row("tokens/s (median)", f"{tps[len(tps) // 2]:,.0f}")
    for task, by_length in scores.get("scores", {}).items():
        for length, value in by_length.items():
            table.add_row(f"{task} @ {length}", f"{value:.2f}" if isinstance(value, float) else str(value))
    # associative recall: also the queries whose answer lies beyond the stacked local windows,
    # which only a branch that reads the whole prefix can answer
    for length, split in scores.get("breakdown", {}).get("mqar", {}).items():
        if split.get("beyond") is not None:
            table.add_row(f"mqar beyond {split['reach']} tokens @ {length}",
                          f"{split['beyond']:.2f} (floor {split['beyond_floor']:.2f}, {split['beyond_n']} queries)")
    Console().print(table)
