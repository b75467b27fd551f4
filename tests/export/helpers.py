"""A checkpoint of random weights written without training (config.yaml, model_fp32.pt, manifest),
for export tests that need a model of a kind and size but no optimizer state."""

from __future__ import annotations

from pathlib import Path

import torch

from fsframework.checkpoints import CONFIG_FILE, FP32_FILE, RunDir, step_name
from fsframework.checkpoints.writing import write_manifest
from fsframework.config import load_config, to_yaml
from fsframework.models.registry import build_model

# small shapes of every trainable kind: FreeSolo blocks of 16 over 4 cells of 4
SMALL = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.vocab_size=260",
         "model.attention.window=16", "model.attention.block_size=16", "model.attention.cell_size=4",
         "model.attention.top_k=2", "model.attention.recent_cells=2", "model.attention.retained_cells=4",
         "data.seq_len=64", "eval.lengths=[64]"]


def random_checkpoint(root: Path, kind: str, *overrides: str, seed: int = 0) -> Path:
    """A run directory `root` holding one complete checkpoint of a `kind` model of random weights."""
    cfg = load_config(None, [*SMALL, f"model.name={kind}", f"run_dir={root}", *overrides])
    torch.manual_seed(seed)
    model = build_model(cfg.model)
    with torch.no_grad():  # norms and gains off their init values, so a wrong mapping shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    run = RunDir(root)
    ckpt = run.step(1)
    ckpt.mkdir(parents=True)
    (ckpt / CONFIG_FILE).write_text(to_yaml(cfg))
    run.config.write_text(to_yaml(cfg))
    torch.save(model.state_dict(), ckpt / FP32_FILE)
    write_manifest(ckpt)
    (run.checkpoints / "latest").write_text(step_name(1))
    return root
