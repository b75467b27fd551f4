"""Pre-norm decoder-only language model (Transformer++ shape) with a pluggable attention.

Legend: B batch, T time, D model width, V vocab.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch import nn

from fsframework.config import ModelConfig
from fsframework.models.blocks import RMSNorm, SwiGLU, dropout, sinusoidal_table
from fsframework.models.context import WHOLE_SEQUENCE, KeySource
from fsframework.models.losses import head_output
from fsframework.models.recompute import recomputed, wants_recompute


class DecoderBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, attention: nn.Module):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = attention
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.ffn_hidden)
        self.drop = dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, source: KeySource = WHOLE_SEQUENCE) -> torch.Tensor:
        x = x + self.drop(self.attn(self.attn_norm(x), source))
        return x + self.drop(self.mlp(self.mlp_norm(x)))


class TransformerLM(nn.Module):
    activation_checkpointing = False  # recompute each block in backward (fsframework.models.recompute)

    def __init__(self, cfg: ModelConfig, attention_factory: Callable[[ModelConfig, int], nn.Module],
                 absolute_positions: bool = False):
        super().__init__()
        self.cfg = cfg
        self.absolute_positions = absolute_positions
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.embed_drop = dropout(cfg.dropout)
        self.layers = nn.ModuleList(DecoderBlock(cfg, attention_factory(cfg, i)) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.reset_parameters()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def reset_parameters(self) -> None:
        """Normal init of every Linear/Embedding weight, zero biases; modules with other
        parameters (norm gains, gates) re-initialise them in `reset_extra_parameters`."""
        std = self.cfg.init_std
        residual_scale = 1.0 / math.sqrt(2 * self.cfg.n_layers)
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                # residual-branch outputs scaled down with depth (GPT-2 / OLMo style)
                scale = residual_scale if name.endswith(("wo", "w_down")) else 1.0
                nn.init.normal_(module.weight, mean=0.0, std=std * scale)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        for module in self.modules():
            if hasattr(module, "reset_extra_parameters"):
                module.reset_extra_parameters()

    def hidden_states(self, tokens: torch.Tensor, source: KeySource = WHOLE_SEQUENCE) -> torch.Tensor:
        """tokens `[B, n]` at absolute positions `[source.start, source.start + n)` -> final
        hidden states `[B, n, D]`.

        `source` supplies each attention layer with the keys of the positions before
        `source.start` (`fsframework.models.context`): none in training (the whole
        sequence is here), another rank's in sequence parallelism, a decode cache's.
        """
        x = self.embed(tokens)
        if self.absolute_positions:
            pos = source.positions(tokens.shape[1], tokens.device)
            x = x + sinusoidal_table(pos, self.cfg.d_model).to(x.dtype)
        x = self.embed_drop(x)
        recompute = wants_recompute(self)
        for layer in self.layers:
            x = recomputed(layer, x, source) if recompute else layer(x, source)
        return self.norm(x)

    def forward(self, tokens: torch.Tensor, targets: Optional[torch.Tensor] = None,
                loss_chunk: int = 0) -> torch.Tensor:
        """tokens `[B, T]` -> logits `[B, T, V]`; given `targets` `[B, T]`, their per-token losses
        `[B, T]` instead, the head run `loss_chunk` positions at a time (`models.losses.head_output`)."""
        return head_output(self.lm_head, self.hidden_states(tokens), targets, loss_chunk)
