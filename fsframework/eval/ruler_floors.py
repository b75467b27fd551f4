"""The floor of every RULER task: what a model that found the answer's kind of item but not which
item scores on the same prompts (docs/evaluation.md §4.1).

The shortcut model answers with as many items as the task asks for, drawn uniformly from the
candidates of the answer's kind in the prompt; its expected `string_match_all` is
`min(1, k / |candidates|)` when the k answers are among the candidates. The candidates:

| task | candidates in the prompt |
|---|---|
| niah_* | the values of the asked kind: 7-digit numbers, or UUIDs |
| vt | every `VAR` name (the one-shot example's included) |
| cwe | the distinct words of the task's list |
| fwe | the distinct coded words of the text ("..." not counted) |
| qa_1, qa_2 | the documents: it copies a random one (`string_match_part`: any gold answer in it) |

A model at its floor read the prompt's items but not the question; only a score above it
shows retrieval (vt with one chain has a high floor: copying all names of the task finds them).
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"(?<!\d)\d{7}(?!\d)")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_VAR = re.compile(r"VAR ([A-Z]+) =")


def _draw_floor(candidates: set[str], answers: list[str]) -> float:
    if not candidates:
        return 0.0
    hits = sum(a in candidates for a in answers) / len(answers)
    return 100.0 * hits * min(1.0, len(answers) / len(candidates))


def sample_floor(task: str, text: str, answers: list[str]) -> float:
    """The shortcut model's expected score (0-100) on one prompt (`text`, decoded) of `task`."""
    if task.startswith("niah"):
        return _draw_floor(set((_UUID if "-" in answers[0] else _NUMBER).findall(text)), answers)
    if task == "vt":
        return _draw_floor(set(_VAR.findall(text)), answers)
    if task == "cwe":
        listed = text[text.rfind("Below is a numbered list"):].split("\nQuestion")[0]
        return _draw_floor(set(re.findall(r"\d+\. ([a-z]+)", listed)), answers)
    if task == "fwe":
        coded = text[text.rfind("coded words. "):].split("\nQuestion")[0].split()[3:]
        return _draw_floor({w for w in coded if re.fullmatch(r"[a-z]+", w)}, answers)
    if task in ("qa_1", "qa_2"):
        context = text.split("\n\nAnswer the question based on the given documents.")[0]
        documents = re.split(r"\n\nDocument \d+:\n", context)[1:] or [context]
        holding = sum(any(a.lower() in d.lower() for a in answers) for d in documents)
        return 100.0 * holding / len(documents)
    raise ValueError(f"no floor for task {task!r}")
