"""Activation checkpointing (`train.activation_checkpointing`, docs/training.md): a block's
activations are not kept for the backward pass but recomputed there from its input.

A Transformer recomputes each decoder block (its saved input is one `[B, T, D]` tensor per
layer); AR-GRC recomputes each call of its cell, one per tree level, so a level keeps only the
composed `[B, n, D]` values and not the cell's `4D`-wide hidden layer. torch's non-reentrant
checkpoint restores the RNG state (dropout draws the same mask twice) and works with inputs
that need no gradient, so gradients equal those without it bit for bit, under sequence
parallelism (the recomputed block fetches the earlier ranks' keys again, in the same order on
every rank) and every ZeRO stage (ZeRO-3 gathers the block's parameters again for it).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from fsframework.models.language_model import LanguageModel


def recomputed(block: Callable[..., torch.Tensor], *args) -> torch.Tensor:
    """`block(*args)` whose activations are recomputed in the backward pass."""
    return checkpoint(block, *args, use_reentrant=False)


def wants_recompute(model: nn.Module) -> bool:
    """Whether a forward of `model` recomputes its blocks: switched on, and a backward may follow."""
    return model.activation_checkpointing and torch.is_grad_enabled()


def enable_activation_checkpointing(model: nn.Module) -> nn.Module:
    """Switch on activation checkpointing for a language model of the registry
    (`LanguageModel.enable_activation_checkpointing`); returns `model`."""
    if not isinstance(model, LanguageModel):
        raise TypeError(f"{type(model).__name__} has no activation checkpointing")
    model.enable_activation_checkpointing()
    return model
