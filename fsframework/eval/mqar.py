"""The `mqar` evaluation task: associative-recall accuracy at any length (docs/evaluation.md §4.6).

Rows come from `fsframework.data.mqar.recall_rows` with the run's `data.mqar` sizes, the pairs
spread over the whole context of the evaluated length. One forward pass per batch, teacher
forced: a query is correct when the argmax over the whole vocabulary at its key equals its
value (exact match per queried value, as the Zoology benchmark scores MQAR). Queries are also
split by how far back their answer lies: `within` the reach of the stacked local windows
(`model.n_layers * model.attention.window` tokens) or `beyond` it, where only a branch that
reads the whole prefix can find it.
"""

from __future__ import annotations

import torch

from fsframework.data.mqar import recall_rows


def _query_logits(model, inputs: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """Logits `[Q, V]` at the positions `where` `[B, T]` (bool) only: the output head runs on the
    scored positions, not on `[B, T, V]`."""
    if hasattr(model, "hidden_states") and hasattr(model, "lm_head"):
        return model.lm_head(model.hidden_states(inputs)[where]).float()
    return model(inputs)[where].float()


@torch.inference_mode()
def mqar_scores(model, spec, length: int, num_samples: int, seed: int, batch_size: int, reach: int,
                device) -> dict:
    """Accuracy (0-100) on `num_samples` rows of `length` input tokens: `score` over every query,
    `within` / `beyond` over the queries whose answer lies at most / more than `reach` tokens
    back, with their query counts (`within_n`, `beyond_n`). A split with no query is None."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + length)
    rows = recall_rows(gen, spec, num_samples, length)
    correct, distance = [], []
    for start in range(0, num_samples, batch_size):
        part = slice(start, start + batch_size)
        tokens = rows.tokens[part].to(device)
        where = rows.weights[part].to(device) > 0
        predicted = _query_logits(model, tokens[:, :-1], where).argmax(dim=-1)
        correct.append((predicted == tokens[:, 1:][where]).cpu())
        distance.append(rows.distance()[part][where.cpu()])
    hits, far = torch.cat(correct), torch.cat(distance) > reach

    def accuracy(mask: torch.Tensor):
        return 100.0 * float(hits[mask].double().mean()) if bool(mask.any()) else None

    return {"score": accuracy(torch.ones_like(far)), "within": accuracy(~far), "beyond": accuracy(far),
            "within_n": int((~far).sum()), "beyond_n": int(far.sum()), "reach": reach}
