"""Recall-weighted loss: the formula, and the weights the loader attaches to each batch."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fsframework.config import LossConfig
from fsframework.data.loader import Collate
from fsframework.data.masks import loss_weights, recall_masks
from fsframework.models.losses import lm_losses


def test_weighted_loss_is_weighted_mean_of_token_losses():
    torch.manual_seed(0)
    logits = torch.randn(2, 7, 11)
    targets = torch.randint(0, 11, (2, 7))
    targets[0, 3] = -100
    weights = torch.rand(2, 7) * 10 + 1
    loss, plain = lm_losses(logits, targets, weights)
    ce = F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1), ignore_index=-100, reduction="none")
    keep = targets.reshape(-1) != -100
    w = weights.reshape(-1)[keep]
    torch.testing.assert_close(loss, (ce[keep] * w).sum() / w.sum())
    torch.testing.assert_close(plain, ce[keep].mean())
    same, _ = lm_losses(logits, targets, torch.full((2, 7), 3.0))
    torch.testing.assert_close(same, plain)


def test_collate_attaches_recall_weights_indexed_by_target():
    rng = np.random.default_rng(0)
    span = rng.integers(0, 50, 40)
    tokens = np.concatenate([span, rng.integers(50, 100, 60), span, rng.integers(100, 150, 20)]).astype(np.int32)
    doc_ids = np.zeros_like(tokens)
    cfg = LossConfig(recall_weighting=True, min_distance=30, switch_window=8)
    batch = Collate(cfg)([{"tokens": tokens, "doc_ids": doc_ids}])
    f, chi = recall_masks(tokens, doc_ids, ngram=4, min_distance=30, switch_window=8)
    assert f.sum() > 30, "the repeated span is recalled"
    expected = loss_weights(f, chi, beta=9.0, beta_switch=9.0)[1:]
    np.testing.assert_array_equal(batch["weights"][0].numpy(), expected)
    assert batch["weights"].shape == batch["targets"].shape
    # the weights line up with the targets: a recalled target token gets weight 10 or more
    recalled = np.flatnonzero(f[1:])
    assert (batch["weights"][0, recalled] >= 10).all()
    assert "weights" not in Collate(None)([{"tokens": tokens, "doc_ids": doc_ids}])
