"""What a resume may change: the config a checkpoint was written with against the one resuming it.

Every config key falls under one rule of `RESUME_RULES` (its longest listed prefix), the table
docs/training.md prints:
- refused: the weights, the data windows and the tokenizer's ids must stay what the checkpoint
  holds, so a change of the model (any `model.*` key but the runtime choices), `data.seq_len` or
  `data.tokenizer` is refused before anything is built or written;
- applied: the optimizer and the schedule (`optim.*`, `train.max_steps`): the new values replace
  those in the checkpoint's optimizer and scheduler state, each named in a notice;
- announced: what changes the batches from here on (the data, its order, the batch size, the
  warm-ups, the loss weighting): taken, named in a notice, because the run no longer continues
  the one it resumes (an uninterrupted run would have seen other batches);
- given: how the run executes, logs, saves and evaluates (the parallel layout is checked by
  `resize`): taken without a word.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fsframework.config import Config

REFUSED, APPLIED, ANNOUNCED, GIVEN = "refused", "applied", "announced", "given"

# a dotted key or section -> what a resume does when it changes; the longest match rules
RESUME_RULES: dict[str, str] = {
    "model": REFUSED,
    "model.attention.impl": GIVEN, "model.dropout": GIVEN,  # how the same weights run, not what they are
    "model.attention.fsb": GIVEN,  # FS-B reads the same weights its own way
    "data": ANNOUNCED,
    "data.seq_len": REFUSED, "data.tokenizer": REFUSED,
    # data.eval_fraction is announced with the rest of data: the embedded corpus's training split is
    # keyed by it (fsframework.data.corpus), so another value trains on other documents
    "data.cache_dir": GIVEN, "data.num_workers": GIVEN,
    "optim": APPLIED, "train.max_steps": APPLIED,
    "train": GIVEN,
    "train.short_seq_len": ANNOUNCED, "train.short_seq_steps": ANNOUNCED,
    "loss": ANNOUNCED, "research": ANNOUNCED,
    "parallel": GIVEN, "eval": GIVEN, "run_dir": GIVEN, "schema_version": GIVEN,
}


def resume_rule(key: str) -> str:
    """The rule of dotted `key`: its longest listed prefix's (KeyError when none lists it)."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        rule = RESUME_RULES.get(".".join(parts[:n]))
        if rule is not None:
            return rule
    raise KeyError(f"{key}: no rule in RESUME_RULES says what a resume does when it changes")


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix[:-1]: data}
    flat = {}
    for key, value in data.items():
        flat.update(_flat(value, f"{prefix}{key}."))
    return flat


def _same(a: Any, b: Any) -> bool:
    return (list(a) == list(b)) if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) else a == b


def changed_keys(saved: Config, now: Config) -> dict[str, list[str]]:
    """The dotted keys whose values differ, by rule (refused, applied, announced, given)."""
    old, new = _flat(asdict(saved)), _flat(asdict(now))
    changed: dict[str, list[str]] = {REFUSED: [], APPLIED: [], ANNOUNCED: [], GIVEN: []}
    for key in sorted(set(old) | set(new)):
        if not _same(old.get(key), new.get(key)):
            changed[resume_rule(key)].append(key)
    return changed


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
