"""Scores on a 0-100 scale, as RULER computes them (`eval/synthetic/constants.py`).

- `string_match_all`: per sample, the fraction of reference strings found
  (case-insensitive substring) in the prediction; averaged over samples, x100.
- `string_match_part`: per sample, 1 if any reference is found; averaged, x100.
- `passkey_match`: the first digit run of the prediction equals the passkey.

The aggregate functions round to two decimals like RULER; the per-sample
functions are what the suite records for each sample.
"""

from __future__ import annotations

import re
from typing import Sequence

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess_pred(text: str) -> str:
    """RULER's cleanup: strip, and turn control characters into newlines."""
    return _CONTROL.sub("\n", text.strip()).strip()


def sample_match_all(pred: str, refs: Sequence[str]) -> float:
    pred = pred.lower()
    return 100.0 * sum(r.lower() in pred for r in refs) / len(refs)


def sample_match_part(pred: str, refs: Sequence[str]) -> float:
    pred = pred.lower()
    return 100.0 * max(float(r.lower() in pred) for r in refs)


def string_match_all(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    return round(sum(sample_match_all(p, r) for p, r in zip(preds, refs)) / len(preds), 2)


def string_match_part(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    return round(sum(sample_match_part(p, r) for p, r in zip(preds, refs)) / len(preds), 2)


def passkey_match(pred: str, passkey: str) -> float:
    """100 when the first run of digits in the prediction is exactly the passkey, else 0
    (so "123456" or a different number first does not count as "12345")."""
    found = re.search(r"\d+", pred)
    return 100.0 if found is not None and found.group(0) == passkey else 0.0


def mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 2) if values else None
