"""The model's settings (`model.*`): sizes and init, the attention group and AR-GRC's group.

`model.name` is a kind of the table of kind facts (`fsframework.config.kinds`), which the model
registry (`fsframework.models.registry`) reads too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fsframework.config.argrc import ArgrcConfig, check_argrc
from fsframework.config.attention import AttentionConfig, check_attention
from fsframework.config.checks import ConfigError, choice, positive_fields
from fsframework.config.kinds import KIND_NAMES, is_freesolo


@dataclass
class ModelConfig:
    name: str = "tfpp"  # a kind of fsframework.config.kinds
    vocab_size: int = 260
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    mlp_hidden: int = 0  # 0: SwiGLU width 8/3 d_model rounded up to a multiple of 64
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    init_std: float = 0.02
    dropout: float = 0.0  # on the embeddings and every residual branch (AR-GRC: embeddings, MLPs, scan output)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    argrc: ArgrcConfig = field(default_factory=ArgrcConfig)  # model.name=argrc only

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ffn_hidden(self) -> int:
        if self.mlp_hidden > 0:
            return self.mlp_hidden
        return ((8 * self.d_model // 3) + 63) // 64 * 64


def check_model(m: ModelConfig) -> None:
    choice("model.name", m.name, KIND_NAMES)
    positive_fields("model", m, ("vocab_size", "d_model", "n_layers", "n_heads"))
    if m.d_model % m.n_heads:
        raise ConfigError(f"model.d_model={m.d_model} must be a multiple of model.n_heads={m.n_heads}")
    if m.head_dim % 2:
        raise ConfigError(f"head dim d_model/n_heads={m.head_dim} must be even for RoPE")
    if not 0.0 <= m.dropout < 1.0:
        raise ConfigError(f"model.dropout={m.dropout} must lie in [0, 1)")
    check_attention(m.attention, freesolo=is_freesolo(m.name), n_heads=m.n_heads)
    check_argrc(m.argrc)
