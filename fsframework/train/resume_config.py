"""What a resume may change: the config a checkpoint was written with against the one resuming it.

The weights, the data windows and the tokenizer's ids must stay what the checkpoint holds, so a
change of the model (any `model.*` key but the runtime choices below), `data.seq_len` or
`data.tokenizer` is refused before anything is built or written. The optimizer and the schedule
(`optim.*`, `train.max_steps`) may change: the new values replace those in the checkpoint's
optimizer and scheduler state, each named in a notice. Other keys (logging, checkpoint cadence,
parallel layout, checked by `resize`) are taken as given.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fsframework.config import Config

# model keys that choose how the same weights run, not what they are
RUNTIME_MODEL_KEYS = ("model.attention.impl", "model.dropout")
RUNTIME_MODEL_PREFIXES = ("model.attention.fsb.",)  # FS-B reads the same weights its own way
FIXED_DATA_KEYS = ("data.seq_len", "data.tokenizer")
SCHEDULE_KEYS = ("train.max_steps",)


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix[:-1]: data}
    flat = {}
    for key, value in data.items():
        flat.update(_flat(value, f"{prefix}{key}."))
    return flat


def _same(a: Any, b: Any) -> bool:
    return (list(a) == list(b)) if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) else a == b


def changed_keys(saved: Config, now: Config) -> tuple[list[str], list[str]]:
    """(refused, applied): the dotted keys whose values differ, split by what a resume may change."""
    old, new = _flat(asdict(saved)), _flat(asdict(now))
    refused, applied = [], []
    for key in sorted(set(old) | set(new)):
        if _same(old.get(key), new.get(key)):
            continue
        if key.startswith("model.") and not (key in RUNTIME_MODEL_KEYS or key.startswith(RUNTIME_MODEL_PREFIXES)):
            refused.append(key)
        elif key in FIXED_DATA_KEYS:
            refused.append(key)
        elif key.startswith("optim.") or key in SCHEDULE_KEYS:
            applied.append(key)
    return refused, applied


def describe(keys: list[str], saved: Config, now: Config) -> str:
    old, new = _flat(asdict(saved)), _flat(asdict(now))
    return ", ".join(f"{key} {old.get(key)!r} -> {new.get(key)!r}" for key in keys)


def apply_optimizer_settings(optimizer, scheduler, saved: Config, now: Config) -> None:
    """Put `now`'s optimizer values into param groups and the scheduler loaded from a checkpoint
    written under `saved` (loading restores the saved ones). Every group's base lr is scaled by
    the lr ratio, so a group with its own multiple of optim.lr keeps it; the current lr is the
    new base times the schedule's factor at the resumed step (the lambda reads `now`)."""
    o = now.optim
    scheduler.base_lrs = [o.lr * (base / saved.optim.lr) for base in scheduler.base_lrs]
    factors = [fn(scheduler.last_epoch) for fn in scheduler.lr_lambdas]
    for i, (group, base, factor) in enumerate(zip(optimizer.param_groups, scheduler.base_lrs, factors)):
        group["initial_lr"], group["lr"] = base, base * factor
        group["betas"], group["eps"] = tuple(o.betas), o.eps
        if i == 0:  # the decayed matrices (trainer.param_groups); the others never decay
            group["weight_decay"] = o.weight_decay
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
