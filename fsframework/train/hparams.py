"""The settings runs are compared by, for tensorboard's HPARAMS tab.

`run_hparams` is a flat dict of scalars: the model's shape, the attention settings its kind reads,
the batch (sequences and tokens per optimizer step, all ranks), the optimizer and schedule, the
parallel layout, the seed. Keys are the config's dotted keys where a value is one; the derived values
have keys of their own (`batch.*`, `parallel.world_size`, `model.parameters`). Kinds read different
settings, so each kind's row lists only its own (`KindFacts.compared_settings`): a TF++ run shows no
`model.attention.cell_size`.

`write_session_start` puts them in the run's own log directory (not in a sub-run, as
`SummaryWriter.add_hparams` does), so a run appears once in the table, beside its scalars.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from fsframework.config import Config, global_batch_sequences
from fsframework.config.kinds import kind_facts

HParam = Union[int, float, str]


def _scalar(value: Any) -> HParam:
    # a bool as text: tensorboard stores numbers as floats, "true" filters as a discrete value
    return str(value).lower() if isinstance(value, bool) else value


def run_hparams(cfg: Config, world_size: int, parameters: Optional[int] = None) -> dict[str, HParam]:
    """The run's hyperparameters, flat and scalar; `parameters`: the model's trainable count, when known."""
    m, d, p = cfg.model, cfg.data, cfg.parallel
    sequences = global_batch_sequences(cfg, world_size)
    hparams: dict[str, Any] = {
        "model.name": m.name, "model.d_model": m.d_model, "model.n_layers": m.n_layers, "model.n_heads": m.n_heads,
        "model.vocab_size": m.vocab_size,
        **{f"model.{key}": value for key, value in kind_facts(m.name).compared(m).items()},
        "data.source": d.source, "data.seq_len": d.seq_len, "data.micro_batch_size": d.micro_batch_size,
        "data.document_masking": d.document_masking,
        "batch.sequences": sequences, "batch.tokens": sequences * d.seq_len,
        "optim.lr": cfg.optim.lr, "optim.warmup_steps": cfg.optim.warmup_steps, "optim.decay": cfg.optim.decay,
        "optim.min_lr_ratio": cfg.optim.min_lr_ratio, "optim.weight_decay": cfg.optim.weight_decay,
        "optim.grad_clip": cfg.optim.grad_clip, "loss.recall_weighting": cfg.loss.recall_weighting,
        "train.max_steps": cfg.train.max_steps, "train.seed": cfg.train.seed,
        "parallel.world_size": world_size, "parallel.sp": p.sp, "parallel.zero_stage": p.zero_stage,
        "parallel.grad_accum": p.grad_accum, "parallel.precision": p.precision,
    }
    if parameters is not None:
        hparams["model.parameters"] = parameters
    return {key: _scalar(value) for key, value in hparams.items()}


def write_session_start(writer: Any, hparams: dict[str, HParam], step: int) -> None:
    """The run's hyperparameters as its HPARAMS session, in `writer`'s own log directory.

    Only the session start is written, no experiment summary: tensorboard takes one run's experiment
    summary (any one) as the columns of every run under a log directory, which would hide the settings
    of other kinds; without it, the columns are the union of the runs' hyperparameters, and every
    scalar of a run is a metric column holding its last value (`train/loss`, `val/best_ppl`, ...).
    A resumed run writes its session again, into the same directory: tensorboard keeps the first
    one it reads, so the run stays one row."""
    from torch.utils.tensorboard.summary import hparams as hparams_summaries  # tensorboard: only where it is on

    _, session_start, _ = hparams_summaries(hparams, {})
    writer.file_writer.add_summary(session_start, step)
