"""The RULER suite (NVIDIA RULER; docs/evaluation.md §4.1): its 13 tasks, one entry point that
generates any of them (`ruler_samples`), their scorers and the suite mean of the FreeSolo paper.

| task | family | generated tokens | score | module |
|---|---|---|---|---|
| niah_single_1..3, niah_multikey_1..3, niah_multivalue, niah_multiquery | niah | 128 | string_match_all | `niah` |
| vt | variable tracking | 30 | string_match_all | `ruler_vt` |
| cwe | common words extraction | 120 | string_match_all | `ruler_words` |
| fwe | frequent words extraction | 50 | string_match_all | `ruler_words` |
| qa_1 (SQuAD), qa_2 (HotpotQA) | question answering | 32 | string_match_part | `ruler_qa` |

The suite mean (the paper's Table 1) averages 12 tasks at lengths below `QA2_FROM` (2k/4k in
the paper) and 13 from it on (8k/16k: QA-2 added). `suite_mean` says how many of them a mean
covers and which are missing, so a mean over fewer tasks is never read as the suite's.
"""

from __future__ import annotations

from dataclasses import dataclass

from fsframework.config.evaluation import EvalConfig
from fsframework.eval.niah import NIAH_GEN_TOKENS, NIAH_TASKS, niah_samples
from fsframework.eval.prompts import NaturalHaystack, Sample
from fsframework.eval.ruler_qa import QA_GEN_TOKENS, qa_file, qa_samples
from fsframework.eval.ruler_vt import VT_GEN_TOKENS, vt_samples
from fsframework.eval.ruler_words import CWE_GEN_TOKENS, FWE_GEN_TOKENS, cwe_samples, fwe_samples
from fsframework.eval.scoring import sample_match_all, sample_match_part


@dataclass(frozen=True)
class RulerTask:
    family: str  # niah, vt, cwe, fwe or qa
    gen_tokens: int  # RULER's tokens_to_generate
    match: str  # "all": every answer must appear (string_match_all); "part": any one (string_match_part)


RULER_TASKS: dict[str, RulerTask] = {
    **{name: RulerTask("niah", NIAH_GEN_TOKENS, "all") for name in NIAH_TASKS},
    "vt": RulerTask("vt", VT_GEN_TOKENS, "all"),
    "cwe": RulerTask("cwe", CWE_GEN_TOKENS, "all"),
    "fwe": RulerTask("fwe", FWE_GEN_TOKENS, "all"),
    "qa_1": RulerTask("qa", QA_GEN_TOKENS, "part"),
    "qa_2": RulerTask("qa", QA_GEN_TOKENS, "part"),
}
QA_TASKS = ("qa_1", "qa_2")
SUITE = "ruler"  # the task name that stands for all 13
QA2_FROM = EvalConfig.ruler_qa2_from  # the paper: 12 tasks at 2k/4k, 13 (QA-2 added) at 8k/16k


def suite_tasks(length: int, qa2_from: int = QA2_FROM) -> tuple[str, ...]:
    """The tasks the suite mean averages at `length`: all but qa_2 below `qa2_from`, all 13 from it on."""
    return tuple(t for t in RULER_TASKS if t != "qa_2" or length >= qa2_from)


def check_qa_files(tasks: list[str], ruler_data) -> None:
    """The official file of every QA task `tasks` will run: those named, and both under "ruler" when
    `ruler_data` is given (without it "ruler" runs the other 11). `QADataMissing` names a missing
    file and where to put it; called before a model loads or trains."""
    for task in QA_TASKS:
        if task in tasks or (SUITE in tasks and ruler_data):
            qa_file(task, ruler_data)


def ruler_samples(task: str, tokenizer, length: int, num_samples: int, seed: int, *, gen_tokens: int | None = None,
                  haystack: NaturalHaystack | None = None, data_dir=None) -> list[Sample]:
    """`num_samples` prompts of RULER task `task`, each `length - gen_tokens` tokens long (default:
    RULER's budget of the task), with the strings a correct answer holds. `haystack` is the NIAH
    essay text (built when None); `data_dir` the folder of the QA tasks' official files.
    Raises `PromptTooLong` when the task cannot fit at `length`, `QADataMissing` for QA without its file."""
    if task not in RULER_TASKS:
        raise ValueError(f"unknown RULER task {task!r}; choose one of {', '.join(RULER_TASKS)}")
    spec = RULER_TASKS[task]
    gen = spec.gen_tokens if gen_tokens is None else gen_tokens
    if spec.family == "niah":
        return niah_samples(task, tokenizer, length, num_samples, seed, gen_tokens=gen, haystack=haystack)
    if spec.family == "vt":
        return vt_samples(tokenizer, length, num_samples, seed, gen_tokens=gen)
    if spec.family == "cwe":
        return cwe_samples(tokenizer, length, num_samples, seed, gen_tokens=gen)
    if spec.family == "fwe":
        return fwe_samples(tokenizer, length, num_samples, seed, gen_tokens=gen)
    return qa_samples(task, tokenizer, length, num_samples, seed, data_dir=data_dir, gen_tokens=gen)


def score_sample(task: str, prediction: str, answers: list[str]) -> float:
    """RULER's per-sample score (0-100) of a prediction for `task`."""
    if RULER_TASKS[task].match == "part":
        return sample_match_part(prediction, answers)
    return sample_match_all(prediction, answers)


def suite_mean(scores: dict[str, dict[str, float | None]], lengths: list[int], qa2_from: int = QA2_FROM
               ) -> tuple[dict[str, float], dict[str, dict]]:
    """Per length: the mean of the suite's tasks that have a score, and what it covers
    (`{"tasks": k, "of": 12 or 13, "missing": [...]}`); a length without any task has no mean."""
    means, coverage = {}, {}
    for n in lengths:
        suite = suite_tasks(n, qa2_from)
        values = {t: scores[t][str(n)] for t in suite if scores.get(t, {}).get(str(n)) is not None}
        if values:
            means[str(n)] = round(sum(values.values()) / len(values), 2)
            coverage[str(n)] = {"tasks": len(values), "of": len(suite), "missing": [t for t in suite if t not in values]}
    return means, coverage
