"""Checkpoint conversion with a numerical proof: the consolidated fp32 file gives the same
logits as the engine checkpoint it came from."""

from __future__ import annotations

from pathlib import Path

import torch

from fsframework.train import checkpoint as ckpt_io


def convert_to_fp32(path: str | Path, *, proof_tokens: int = 64) -> tuple[Path, float]:
    """Write `<ckpt>/model_fp32.pt` (any ZeRO stage) and return it with the largest absolute
    logit difference between the engine-state weights and the written file (must be 0)."""
    from fsframework.config import load_config
    from fsframework.models.registry import build_model

    ckpt = ckpt_io.resolve_checkpoint(path)
    stale = ckpt / "model_fp32.pt"
    if stale.exists():
        stale.unlink()  # the proof must read the engine state, not a previous conversion
    source = ckpt_io.consolidated_state_dict(ckpt)
    out = ckpt_io.write_fp32_model(ckpt)
    cfg = load_config(ckpt / "config.yaml")
    tokens = torch.randint(0, min(cfg.model.vocab_size, 256), (1, proof_tokens), generator=torch.Generator().manual_seed(0))
    logits = []
    for state in (source, torch.load(out, map_location="cpu", weights_only=True)):
        model = build_model(cfg.model).eval()
        model.load_state_dict(state, strict=not cfg.model.tie_embeddings)
        with torch.no_grad():
            logits.append(model(tokens))
    return out, float((logits[0] - logits[1]).abs().max())
