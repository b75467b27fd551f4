"""Pre-norm decoder-only language model (Transformer++ shape) with a pluggable attention.

Legend: B batch, T time, D model width, V vocab.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch import nn

from fsframework.config import ModelConfig
from fsframework.config.kinds import kind_facts
from fsframework.models.attention import QKVAttention
from fsframework.models.blocks import RMSNorm, SwiGLU, dropout, sinusoidal_table
from fsframework.models.context import WHOLE_SEQUENCE, DocumentRows, KeySource
from fsframework.models.decode_cache import DecodeCache
from fsframework.models.documents import Documents
from fsframework.models.language_model import LanguageModel, SequenceParallelism
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


class TransformerLM(LanguageModel):
    """Decoder blocks around one attention kind (`LanguageModel`, `fsframework.models.language_model`)."""

    activation_checkpointing = False  # recompute each block in backward (fsframework.models.recompute)

    def __init__(self, cfg: ModelConfig, attention_factory: Callable[[ModelConfig, int], nn.Module],
                 absolute_positions: bool = False, layer_cache: Optional[Callable] = None):
        super().__init__()
        self.cfg = cfg
        self.absolute_positions = absolute_positions
        # one layer's decode cache class (the kind's registry entry, `AttentionKind.cache_class`);
        # passed in because the registry, which builds this model, imports this module
        self.layer_cache = layer_cache
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
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
        for module in self.modules():
            if isinstance(module, QKVAttention):  # FreeSolo's gains and prior, rewired's mixing weights
                module.reset_extra_parameters()

    def hidden_states(self, tokens: torch.Tensor, source: KeySource = WHOLE_SEQUENCE, *,
                      documents: Optional[Documents] = None) -> torch.Tensor:
        """tokens `[B, n]` at absolute positions `[source.start, source.start + n)` -> final
        hidden states `[B, n, D]`.

        `source` supplies each attention layer with the keys of the positions before
        `source.start` (`fsframework.models.context`): none in training (the whole
        sequence is here), another rank's in sequence parallelism, a decode cache's.
        `documents`: whole packed rows whose documents are read apart (`fsframework.models.documents`).
        """
        if documents is not None:
            source = DocumentRows(documents)
        x = self.embed(tokens)
        if self.absolute_positions:
            pos = source.positions(tokens.shape[1], tokens.device)
            x = x + sinusoidal_table(pos, self.cfg.d_model).to(x.dtype)
        x = self.embed_drop(x)
        recompute = wants_recompute(self)
        for layer in self.layers:
            x = recomputed(layer, x, source) if recompute else layer(x, source)
        return self.norm(x)

    def sequence_parallel_hidden_states(self, tokens: torch.Tensor, sp, rows: Optional[DocumentRows] = None
                                        ) -> torch.Tensor:
        """This rank's runs: every layer takes the earlier ranks' keys from the parallelism's source;
        with `rows` (document masking) its documents, a continued one reading its earlier tokens."""
        return self.hidden_states(tokens, self.parallelism.key_source(sp) if rows is None else rows)

    def decode_state(self, chunk: Optional[int] = None) -> DecodeCache:
        if self.layer_cache is None:
            raise TypeError(f"this {self.cfg.name} model was built without a layer cache class, so it cannot decode")
        return DecodeCache(self, self.layer_cache, chunk)

    def decodable(self) -> bool:
        """Not sequence parallel, and every layer in the offset form a cache can feed."""
        return super().decodable() and all(isinstance(layer.attn, QKVAttention) for layer in self.layers)

    def enable_sequence_parallel(self, parallelism: SequenceParallelism) -> None:
        """Every attention layer takes the earlier ranks' keys from the source the parallelism makes
        for each sequence; under the zigzag layout each runs once per own run (`KeySource.runs`)."""
        for layer in self.layers:
            if not isinstance(layer.attn, QKVAttention):
                raise TypeError(f"attention {type(layer.attn).__name__} is not in the offset form of "
                                "fsframework.models.attention, so it cannot take keys from other ranks")
        super().enable_sequence_parallel(parallelism)

    def sequence_layouts(self) -> tuple[str, ...]:
        """Zigzag too where a query's work grows with its position: the kinds that read the whole
        prefix (not SWA's window or FS-L's bounded cells)."""
        if kind_facts(self.cfg.name).keys == "prefix":
            return ("contiguous", "zigzag")
        return ("contiguous",)

    def enable_activation_checkpointing(self) -> None:
        self.activation_checkpointing = True

    def recomputed_blocks(self) -> list[nn.Module]:
        return list(self.layers)

    def decoder_blocks(self) -> list[nn.Module]:
        return list(self.layers)

    def zero3_leaf_modules(self, documents: bool = False) -> list[type]:
        """Under the zigzag layout the attention modules: each runs its forward once per run, and as
        leaves their projections are gathered once per layer call, not once per run
        (`python tools/bench_zero3_layout.py`: +31% of the parameters gathered per step otherwise).
        With `documents` read apart too: an attention module runs once per document length, a count
        that differs between ranks, so per-call gathers of its projections would not pair up."""
        zigzag = self.parallelism is not None and self.parallelism.context.layout == "zigzag"
        if not (zigzag or documents):
            return []
        return sorted({type(layer.attn) for layer in self.layers}, key=lambda c: f"{c.__module__}.{c.__qualname__}")

    def shape_summary(self) -> str:
        return f", {self.cfg.n_layers} layers, d_model {self.cfg.d_model}, {self.cfg.n_heads} heads"
