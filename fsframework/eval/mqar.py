"""The `mqar` evaluation task: associative-recall accuracy at any length (docs/evaluation.md §4.6).

Rows come from `fsframework.data.mqar.recall_rows` with the run's `data.mqar` sizes, the pairs
spread over the whole context of the evaluated length. One forward pass per batch, teacher
forced: a query is correct when the argmax over the whole vocabulary at its key equals its
value (exact match per queried value, as the Zoology benchmark scores MQAR). Queries are also
split by how far back their answer lies: `within` the reach of the stacked local windows
(`model.n_layers * model.attention.window` tokens) or `beyond` it, where only a branch that
reads the whole prefix can find it.

Every accuracy comes with its floor on the same rows: the expected accuracy of a model that
answers each query with one of its row's context values drawn uniformly (it has found where the
values are but not which key each belongs to). With P pairs and V value ids that is about
`(1 + (P - 1) / V) / P`, far above `1 / V`, and a model reaches it from the values alone; only
accuracy above it shows key-to-value association. `in_row` is the share of answers that are one
of the row's context values: near 100 for the floor's model and for a recalling one, near 0 for
one that has not found the values.
"""

from __future__ import annotations

import torch

from fsframework.data.mqar import RecallRows, recall_rows
from fsframework.models.language_model import LanguageModel


def _query_logits(model, inputs: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """Logits `[Q, V]` at the positions `where` `[B, T]` (bool) only: the output head runs on the
    scored positions, not on `[B, T, V]`."""
    if isinstance(model, LanguageModel):
        return model.lm_head(model.hidden_states(inputs)[where]).float()
    return model(inputs)[where].float()


def score_answers(rows: RecallRows, where: torch.Tensor, predicted: torch.Tensor, reach: int) -> dict:
    """Scores (0-100) of the answers `predicted` `[Q]` to the queries `where` `[B, T]` (bool,
    row-major order: `rows.weights > 0`) of `rows`: over every query `score`, `floor` (see the
    module docstring) and `in_row`; the same three for the queries whose answer lies at most
    (`within`, `within_floor`, `within_in_row`) or more (`beyond`, ...) than `reach` tokens back,
    with their counts (`within_n`, `beyond_n`). A split with no query scores None."""
    row = where.nonzero()[:, 0]
    answer = rows.tokens[:, 1:][where]
    context_values = rows.values[row]  # [Q, P]
    hits = (predicted == answer).double()
    floor = (context_values == answer[:, None]).double().mean(dim=1)
    in_row = (context_values == predicted[:, None]).any(dim=1).double()
    far = rows.distance()[where] > reach
    found = {"reach": reach, "within_n": int((~far).sum()), "beyond_n": int(far.sum())}
    for split, mask in (("", torch.ones_like(far)), ("within", ~far), ("beyond", far)):
        for name, per_query in (("", hits), ("floor", floor), ("in_row", in_row)):
            key = "_".join(part for part in (split, name) if part) or "score"
            found[key] = 100.0 * float(per_query[mask].mean()) if bool(mask.any()) else None
    return found


@torch.inference_mode()
def mqar_scores(model, spec, length: int, num_samples: int, seed: int, batch_size: int, reach: int,
                device) -> dict:
    """`score_answers` of the model's greedy answers on `num_samples` rows of `length` input tokens."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + length)
    rows = recall_rows(gen, spec, num_samples, length)
    where = rows.weights > 0
    predicted = []
    for start in range(0, num_samples, batch_size):
        part = slice(start, start + batch_size)
        tokens = rows.tokens[part].to(device)
        predicted.append(_query_logits(model, tokens[:, :-1], where[part].to(device)).argmax(dim=-1).cpu())
    return score_answers(rows, where, torch.cat(predicted), reach)
