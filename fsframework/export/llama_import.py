"""`fsf import`: a Llama-architecture transformers checkpoint as a tfpp export directory
(docs/export.md), proved by the logits of transformers' own Llama against ours.

Only safetensors weights are read (`model.safetensors`, or the shards that
`model.safetensors.index.json` names): no pickle. A Llama with grouped-query attention, biases,
RoPE scaling or another activation is refused, naming the field (`fsframework.models.llama`).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import torch

from fsframework.checkpoints import CONFIG_FILE, EXPORT_HF_CONFIG, EXPORT_WEIGHTS, load_model, load_weights
from fsframework.config import Config, to_yaml, validate
from fsframework.export.proof import logits_of, max_difference, proof_batch
from fsframework.export.writer import (ExportError, ExportResult, ProofFailed, export_tensors, hf_config,
                                       save_weights, staged_out_dir)
from fsframework.models.llama import NotTransformerPlusPlus, from_llama_name, model_config_from_llama
from fsframework.models.registry import build_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")
# buffers some older Llama checkpoints store: recomputed from rope_theta, not weights
_RECOMPUTED = ("rotary_emb.inv_freq",)


def read_llama_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    """The safetensors weights of a transformers checkpoint directory, fp32, names as stored."""
    from safetensors.torch import load_file

    single, index = hf_dir / "model.safetensors", hf_dir / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        files = sorted({hf_dir / name for name in json.loads(index.read_text())["weight_map"].values()})
    else:
        pickled = [p.name for p in hf_dir.glob("*.bin")] + [p.name for p in hf_dir.glob("*.pt")]
        raise ExportError(f"{hf_dir} has no model.safetensors (or index of shards)"
                          + (f"; {', '.join(pickled)} are pickle files, which are not read" if pickled else ""))
    state = {}
    for file in files:
        try:
            state.update(load_file(file))
        except Exception as exc:
            raise ExportError(f"{file} is truncated or not a safetensors file ({type(exc).__name__}: {exc})") from None
    return {k: v.float() for k, v in state.items() if not k.endswith(_RECOMPUTED)}


def import_llama(hf_dir: str | Path, out: str | Path, *, dtype: str = "fp32", tolerance: float = 1e-4,
                 log: Callable[[str], Any] = lambda _m: None) -> ExportResult:
    """Write export directory `out` (a tfpp model) from Llama checkpoint `hf_dir`, proved:
    transformers' LlamaForCausalLM on `hf_dir` and our tfpp read back from `out` give logits
    within `tolerance` (fp32)."""
    started = time.perf_counter()
    hf_dir, out = Path(hf_dir), Path(out)
    if not (hf_dir / EXPORT_HF_CONFIG).is_file():
        raise ExportError(f"{hf_dir} has no {EXPORT_HF_CONFIG}: not a transformers checkpoint directory")
    try:
        cfg = Config(run_dir=str(out.resolve()))
        cfg.model = model_config_from_llama(json.loads((hf_dir / EXPORT_HF_CONFIG).read_text()))
        tokenizer = hf_dir / "tokenizer.json"
        cfg.data.tokenizer = str(tokenizer.resolve()) if tokenizer.is_file() else "byte"
        validate(cfg)
    except (NotTransformerPlusPlus, ValueError, KeyError) as exc:
        raise ExportError(f"{hf_dir / EXPORT_HF_CONFIG}: {exc}") from None
    state = {from_llama_name(k): v for k, v in read_llama_weights(hf_dir).items()}
    model = build_model(cfg.model).eval()
    load_weights(model, state, f"Llama checkpoint {hf_dir}")  # a tied lm_head is stored once

    with staged_out_dir(out) as tmp:
        save_weights(export_tensors(model.state_dict(), cfg.model, dtype), tmp / EXPORT_WEIGHTS)
        (tmp / CONFIG_FILE).write_text(to_yaml(cfg))
        for name in TOKENIZER_FILES:
            if (hf_dir / name).is_file():
                shutil.copyfile(hf_dir / name, tmp / name)
        fields = hf_config(cfg, dtype, hf_dir.resolve())
        source = json.loads((hf_dir / EXPORT_HF_CONFIG).read_text())
        fields.update({k: source.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")})
        (tmp / EXPORT_HF_CONFIG).write_text(json.dumps(fields, indent=2))
        difference = prove_against_transformers(hf_dir, tmp)
        log(f"largest |logit difference| transformers Llama vs imported tfpp: {difference:.3g}")
        if not difference <= tolerance:
            raise ProofFailed(f"the imported tfpp model does not reproduce transformers' logits (largest difference "
                              f"{difference:.3g} > {tolerance:g})")
    return ExportResult(out, difference, None, time.perf_counter() - started, len(state))


def prove_against_transformers(hf_dir: Path, exported: Path) -> float:
    """Largest logit difference on the fixed batch: transformers on `hf_dir` vs fsframework on `exported`."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise ExportError("the import's logits proof runs transformers' Llama: pip install transformers") from None
    ours, _ = load_model(exported)
    theirs = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    tokens = proof_batch(ours.cfg.vocab_size)
    return max_difference(logits_of(theirs, tokens), logits_of(ours, tokens))
