"""Activation checkpointing: every trainable kind gives the same loss and gradients with it on
and off (dropout on, so the recomputation must replay the same masks), and keeps fewer bytes
of activations for the backward pass."""

from __future__ import annotations

import pytest
import torch

from fsframework.config import ArgrcConfig, AttentionConfig, ModelConfig
from fsframework.models.recompute import enable_activation_checkpointing
from fsframework.models.registry import KINDS, build_model
from fsframework.models.losses import lm_losses

TRAINABLE = [name for name, kind in KINDS.items() if kind.trainable]


def _config(name: str) -> ModelConfig:
    return ModelConfig(name=name, vocab_size=40, d_model=32, n_layers=2, n_heads=2, dropout=0.1,
                       attention=AttentionConfig(window=15, cell_size=4, block_size=16, top_k=2, impl="reference"),
                       argrc=ArgrcConfig(post_embed_mlp_hidden=16))


def saved_bytes_and_grads(model, tokens: torch.Tensor) -> tuple[int, torch.Tensor, dict[str, torch.Tensor]]:
    """(bytes of the storages kept for backward, parameters excluded; loss; gradients). With
    checkpointing on, what a block keeps is its inputs (counted by a pre-hook on each block)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor):
        if t.untyped_storage().data_ptr() not in params:
            saved.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    def keep_inputs(module, args) -> None:
        for t in args:
            if isinstance(t, torch.Tensor):
                pack(t)

    blocks = model.recomputed_blocks()
    hooks = [block.register_forward_pre_hook(keep_inputs) for block in blocks
             if model.activation_checkpointing]
    torch.manual_seed(1)  # the dropout masks
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = lm_losses(model(tokens[:, :-1]), tokens[:, 1:])[0]
    for hook in hooks:
        hook.remove()
    model.zero_grad()
    loss.backward()
    return sum(saved.values()), loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", TRAINABLE)
def test_recomputed_blocks_give_the_same_gradients(name):
    torch.manual_seed(0)
    model = build_model(_config(name)).train()
    tokens = torch.randint(0, 40, (2, 65))
    plain_bytes, plain_loss, plain_grads = saved_bytes_and_grads(model, tokens)
    enable_activation_checkpointing(model)
    bytes_, loss, grads = saved_bytes_and_grads(model, tokens)
    assert torch.equal(loss, plain_loss)
    assert grads.keys() == plain_grads.keys() and len(grads) > 0
    for key in grads:
        assert torch.equal(grads[key], plain_grads[key]), key
    assert bytes_ < 0.7 * plain_bytes, (bytes_, plain_bytes)
