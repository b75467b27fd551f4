"""The DeepSpeed config names the ZeRO-3 leaf modules: the kind's own and, under the zigzag layout,
the attention modules that run once per run, in the form DeepSpeed matches them by."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from deepspeed.utils.z3_leaf_module import set_z3_leaf_modules  # noqa: E402

from fsframework.config import Config, ModelConfig, load_config  # noqa: E402
from fsframework.models.registry import build_model  # noqa: E402
from fsframework.parallel.context import SPContext  # noqa: E402
from fsframework.parallel.deepspeed_config import deepspeed_config, zero3_leaf_classes  # noqa: E402
from fsframework.parallel.parallelize import SequenceParallel  # noqa: E402


def tiny(name: str) -> Config:
    cfg = Config(model=ModelConfig(name=name, vocab_size=32, d_model=16, n_layers=2, n_heads=2))
    cfg.parallel.zero_stage = 3
    return cfg


@pytest.mark.parametrize("name", ["tfpp", "fs"])
def test_zigzag_attention_modules_are_zero3_leaves(name):
    cfg = tiny(name)
    model = build_model(cfg.model)
    assert "leaf_module" not in deepspeed_config(cfg, model)["zero_optimization"]  # contiguous: no leaves
    contiguous = build_model(cfg.model)
    contiguous.enable_sequence_parallel(SequenceParallel(SPContext(groups=None, block_size=16, layout="contiguous")))
    assert "leaf_module" not in deepspeed_config(cfg, contiguous)["zero_optimization"]
    # what parallelize does under the zigzag layout (the group is not needed to name the leaves)
    model.enable_sequence_parallel(SequenceParallel(SPContext(groups=None, block_size=16, layout="zigzag")))
    leaves = deepspeed_config(cfg, model)["zero_optimization"]["leaf_module"]["classes"]
    assert leaves == zero3_leaf_classes(model) and len(leaves) == 1
    # DeepSpeed finds exactly the attention modules by that name
    assert set_z3_leaf_modules(model, leaves) == [layer.attn for layer in model.layers]
    cfg.parallel.zero_stage = 2
    assert "leaf_module" not in deepspeed_config(cfg, model)["zero_optimization"]


def test_the_kinds_own_leaves_stay():
    cfg = tiny("argrc")
    assert zero3_leaf_classes(build_model(cfg.model)) == ["fsframework.models.argrc.TreeScan"]


def test_attention_modules_are_zero3_leaves_when_documents_are_read_apart():
    """An attention module reads a micro-batch's documents one length at a time, a number of calls of its
    projections that differs between ranks: as a leaf, ZeRO-3 gathers them once per layer call."""
    cfg = load_config(None, ["model.name=fs", "model.n_layers=2", "parallel.zero_stage=3",
                             "data.document_masking=true"])
    model = build_model(cfg.model)
    assert zero3_leaf_classes(model) == []
    leaves = deepspeed_config(cfg, model)["zero_optimization"]["leaf_module"]["classes"]
    assert leaves == ["fsframework.models.freesolo_attention.FreeSoloAttention"]
