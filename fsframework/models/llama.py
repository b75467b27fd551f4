"""Transformer++ in the Llama architecture's terms: tensor names and config fields (docs/export.md).

A `tfpp` model is the Llama architecture: pre-norm RMSNorm blocks, q/k/v/o projections without
bias, RoPE in the half-split convention (`fsframework.ops.rope`, Llama's `rotate_half`), a SwiGLU
MLP `down(silu(gate(x)) * up(x))`, a final RMSNorm and an lm_head that may share the embedding.
Heads are never grouped (Llama's `num_key_value_heads` equals `num_attention_heads`). So a tfpp
export is a native Llama checkpoint and a Llama checkpoint of that shape imports as a tfpp model:
this module holds the naming and the config fields, and imports no torch and no transformers.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any

from fsframework.config import ModelConfig

# our per-layer names -> Llama's (under `model.layers.<i>.`)
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight",
    "attn.wk.weight": "self_attn.k_proj.weight",
    "attn.wv.weight": "self_attn.v_proj.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.w_gate.weight": "mlp.gate_proj.weight",
    "mlp.w_up.weight": "mlp.up_proj.weight",
    "mlp.w_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
              "lm_head.weight": "lm_head.weight"}
_OURS_LAYER = re.compile(r"layers\.(\d+)\.(.+)")
_LLAMA_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_LAYER_BACK = {llama: ours for ours, llama in _LAYER_NAMES.items()}
_TOP_BACK = {llama: ours for ours, llama in _TOP_NAMES.items()}


def to_llama_name(name: str) -> str:
    """A tfpp state-dict key -> its Llama key; a key with no Llama counterpart is returned as is
    (a loader then reports it as unexpected)."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    match = _OURS_LAYER.fullmatch(name)
    if match and match.group(2) in _LAYER_NAMES:
        return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}"
    return name


def from_llama_name(name: str) -> str:
    """A Llama state-dict key -> the tfpp key (the inverse of `to_llama_name`)."""
    if name in _TOP_BACK:
        return _TOP_BACK[name]
    match = _LLAMA_LAYER.fullmatch(name)
    if match and match.group(2) in _LAYER_BACK:
        return f"layers.{match.group(1)}.{_LAYER_BACK[match.group(2)]}"
    return name


def llama_config(model: ModelConfig, *, max_positions: int, torch_dtype: str) -> dict[str, Any]:
    """The fields of a transformers `LlamaConfig` (config.json) for tfpp model `model`."""
    if model.name != _kind():
        raise ValueError(f"only model.name={_kind()} is the Llama architecture, not {model.name}")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": model.vocab_size,
        "hidden_size": model.d_model,
        "intermediate_size": model.ffn_hidden,
        "num_hidden_layers": model.n_layers,
        "num_attention_heads": model.n_heads,
        "num_key_value_heads": model.n_heads,
        "head_dim": model.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": model.norm_eps,
        "rope_theta": model.attention.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": max_positions,  # RoPE needs no table: any length runs
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "tie_word_embeddings": model.tie_embeddings,
        "initializer_range": model.init_std,
        "use_cache": True,
        "torch_dtype": torch_dtype,
    }


class NotTransformerPlusPlus(ValueError):
    """A Llama config uses a feature the tfpp model does not have."""


def model_config_from_llama(hf: dict[str, Any]) -> ModelConfig:
    """The tfpp ModelConfig of a Llama config.json (a dict); raises NotTransformerPlusPlus naming
    every field that tfpp cannot express (grouped heads, biases, RoPE scaling, another activation)."""
    if hf.get("model_type") != "llama":
        raise NotTransformerPlusPlus(f"config.json has model_type={hf.get('model_type')!r}: only \"llama\" "
                                     "checkpoints import as a tfpp model")
    heads, width = hf["num_attention_heads"], hf["hidden_size"]
    problems = []
    if hf.get("num_key_value_heads", heads) != heads:
        problems.append(f"num_key_value_heads={hf['num_key_value_heads']} (grouped-query attention; tfpp has "
                        f"{heads} key/value heads)")
    if (hf.get("head_dim") or width // heads) != width // heads or width % heads:
        problems.append(f"head_dim={hf.get('head_dim')} (tfpp: hidden_size / num_attention_heads)")
    if hf.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={hf['hidden_act']!r} (tfpp: silu)")
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key):
            problems.append(f"{key}=true (tfpp has no biases)")
    if hf.get("rope_scaling"):
        problems.append(f"rope_scaling={hf['rope_scaling']} (tfpp: plain RoPE)")
    if hf.get("pretraining_tp", 1) != 1:
        problems.append(f"pretraining_tp={hf['pretraining_tp']}")
    if problems:
        raise NotTransformerPlusPlus("this Llama checkpoint does not fit a tfpp model: " + "; ".join(problems))
    model = ModelConfig(name=_kind(), vocab_size=hf["vocab_size"], d_model=width, n_layers=hf["num_hidden_layers"],
                        n_heads=heads, mlp_hidden=hf["intermediate_size"], norm_eps=hf.get("rms_norm_eps", 1e-6),
                        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
                        init_std=hf.get("initializer_range", 0.02))
    model.attention.rope_theta = float(hf.get("rope_theta", 10000.0))
    return model


def model_config_dict(model: ModelConfig) -> dict[str, Any]:
    """`model` as plain JSON values (config.json's record of the model config)."""
    return asdict(model)


def _kind() -> str:
    """The registered kind this module writes as Llama (its registry entry's `native_export`)."""
    from fsframework.models.registry import native_kind  # cycle: the registry imports this module

    return native_kind(__name__)


# the registry's adapter interface (AttentionKind.native_export)
to_native_name = to_llama_name
from_native_name = from_llama_name
native_config = llama_config
