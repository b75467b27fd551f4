"""Attention modules of the baseline models (SPEC §1.10, §2 baselines).

Every attention module has the same interface: `Module(cfg: ModelConfig,
layer_idx)` and `forward(x_BTD) -> y_BTD`, so the decoder block does not know
which kind it holds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fsframework.config import ModelConfig
from fsframework.models.blocks import alibi_slopes
from fsframework.ops.local_attention import sliding_window_attention
from fsframework.ops.rope import rotate


class QKVAttention(nn.Module):
    """Shared projections; subclasses define `attend(q, k, v)` on `[B, T, H, Dh]`."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.cfg = cfg
        self.layer_idx = layer_idx
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wo = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        bsz, seq, _ = x.shape
        shape = (bsz, seq, self.n_heads, self.head_dim)
        return self.wq(x).view(shape), self.wk(x).view(shape), self.wv(x).view(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.project(x)
        y = self.attend(q, k, v)
        return self.wo(y.reshape(x.shape))

    def attend(self, q, k, v):  # pragma: no cover - abstract
        raise NotImplementedError


def causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # B T H D -> B H T D for SDPA, and back
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return y.transpose(1, 2)


class RopeAttention(QKVAttention):
    """Transformer++: full causal attention on RoPE-rotated q/k."""

    def attend(self, q, k, v):
        theta = self.cfg.attention.rope_theta
        return causal_sdpa(rotate(q, theta), rotate(k, theta), v)


class SlidingWindowAttention(QKVAttention):
    """SWA baseline: RoPE attention restricted to `0 <= i - j <= window` (SPEC §1.2 rule)."""

    def attend(self, q, k, v):
        a = self.cfg.attention
        return sliding_window_attention(q, k, v, window=a.window, rope_theta=a.rope_theta, impl=a.impl)


class NoPositionAttention(QKVAttention):
    """Plain causal attention; used by the sinusoidal model, whose positions live in the embedding."""

    def attend(self, q, k, v):
        return causal_sdpa(q, k, v)


class AlibiAttention(QKVAttention):
    """Causal attention with the ALiBi bias `-slope_h * (i - j)`, chunked over queries so the
    bias never exceeds `chunk x T` per head."""

    chunk = 512

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.register_buffer("slopes", alibi_slopes(cfg.n_heads), persistent=False)

    def attend(self, q, k, v):
        bsz, seq, heads, dim = q.shape
        qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        out = []
        for start in range(0, seq, self.chunk):
            end = min(start + self.chunk, seq)
            i = torch.arange(start, end, device=q.device)[:, None]
            j = torch.arange(0, end, device=q.device)[None, :]
            dist = (i - j).to(q.dtype)
            bias = -self.slopes.to(q.dtype)[:, None, None] * dist  # H, Tq, Tk
            bias = bias.masked_fill(j > i, float("-inf"))
            out.append(F.scaled_dot_product_attention(qh[:, :, start:end], kh[:, :, :end], vh[:, :, :end],
                                                      attn_mask=bias[None]))
        return torch.cat(out, dim=2).transpose(1, 2)
