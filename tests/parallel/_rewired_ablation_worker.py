"""The SP-vs-single-process check of `_equivalence_worker.py` for the rewired model's ablations:
mean runway (a prefix sum across slices), bilinear score with Bmat moved off the identity, head 1.

Usage: python _rewired_ablation_worker.py SP rewired N[,N...]
"""

from __future__ import annotations

import torch

import _equivalence_worker as worker
from fsframework.config import AttentionConfig, ModelConfig, RewiredConfig
from fsframework.models.registry import build_model


def tiny(kind: str) -> ModelConfig:
    # block 16: the slices are whole blocks, as in the shared worker (7 and 3 blocks for N=100)
    att = AttentionConfig(block_size=16, impl="reference",
                          rewired=RewiredConfig(runway="mean", score="bilinear", head=1))
    return ModelConfig(name=kind, vocab_size=61, d_model=32, n_layers=2, n_heads=2, attention=att)


def build_with_bmat_off_identity(cfg: ModelConfig):
    model = build_model(cfg)
    with torch.no_grad():  # seeded by the caller, so every rank draws the same matrices
        for layer in model.layers:
            layer.attn.bmat.add_(0.3 * torch.randn_like(layer.attn.bmat))
    return model


if __name__ == "__main__":
    worker.tiny = tiny
    worker.build_model = build_with_bmat_off_identity
    worker.main()
