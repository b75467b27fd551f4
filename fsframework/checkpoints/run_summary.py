"""One run's figures from what it wrote (`config.yaml`, `metrics.jsonl`): what `fsf runs` prints
side by side. Reads files only: no torch, no model."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from fsframework.checkpoints.layout import CheckpointError, RunDir, read_config


@dataclass(frozen=True)
class RunSummary:
    name: str
    kind: str
    sizes: str  # d_model x layers x heads, training length
    steps: int
    final_loss: Optional[float]
    final_val_loss: Optional[float]
    best_val_loss: Optional[float]
    tokens_per_s: Optional[float]  # medians over the logged steps
    tflops: Optional[float]
    mfu: Optional[float]
    peak_memory_mb: Optional[float]  # the GPU allocator's peak, else the host's resident set
    records: tuple[dict[str, Any], ...]  # the metrics, for plots


def _median(values: list[float]) -> Optional[float]:
    """The upper median of the finite values (as the end-of-run summary's), None when there are none."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median_high(values) if values else None


def _maximum(values: list[float]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return max(values) if values else None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's records; a line cut short by a crash ends the list."""
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


def summarize_run(path: str | Path) -> RunSummary:
    """The figures of the run directory `path`; CheckpointError when it is none (no config.yaml or
    no metrics.jsonl)."""
    run = RunDir(Path(path))
    if not run.config.is_file() or not run.metrics.is_file():
        raise CheckpointError(f"{path}: not a run directory (it needs config.yaml and metrics.jsonl)")
    cfg = read_config(run.config)
    records = read_metrics(run.metrics)
    m = cfg.model
    val = [r["val/loss"] for r in records if r.get("val/loss") is not None]
    losses = [r["loss"] for r in records if r.get("loss") is not None]
    memory = "cuda_allocated_mb" if any("cuda_allocated_mb" in r for r in records) else "host_rss_mb"
    return RunSummary(
        name=str(path), kind=m.name, sizes=f"{m.d_model}x{m.n_layers}x{m.n_heads} @ {cfg.data.seq_len}",
        steps=records[-1]["step"] if records else 0, final_loss=losses[-1] if losses else None,
        final_val_loss=val[-1] if val else None, best_val_loss=min(val) if val else None,
        tokens_per_s=_median([r.get("tokens_per_s") for r in records]),
        tflops=_median([r.get("tflops") for r in records]), mfu=_median([r.get("mfu") for r in records]),
        peak_memory_mb=_maximum([r.get(memory) for r in records]), records=tuple(records))
