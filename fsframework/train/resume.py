"""Resuming a training run from a checkpoint: the engine state (through `resize` at another
data-parallel size) and each rank's loop state, whose RNG part `rng_state` records at each save.
Writing checkpoints is `fsframework.checkpoints.writing`'s; every file here is read with
`weights_only=True`.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from fsframework.checkpoints import (ENGINE_TAG, CheckpointError, client_state_name, safe_load, weights_only_loads,
                                     without_wrapper_prefix)
from fsframework.config import Config
from fsframework.parallel.process_group import barrier
from fsframework.train import resize


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def load_client_state(ckpt: Path, rank: int, same_layout: bool = True) -> dict[str, Any]:
    """Rank `rank`'s loop state. At another layout (`same_layout` False) every rank takes rank 0's
    (the step, token count and loader position are global; see `fsframework.train.resize`)."""
    path = ckpt / client_state_name(rank if same_layout else 0)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {ckpt} has no loop state for rank {rank} ({path.name}); "
                              "was it written with a different number of ranks?")
    state = safe_load(path)
    if not isinstance(state, dict) or not {"train_state", "loader", "rng"} <= set(state):
        raise CheckpointError(f"checkpoint file {path} holds no loop state (train_state, loader, rng)")
    return state


def _load_module_state(src: dict, dst) -> None:
    """DeepSpeed's module loading (strict), for engine states of any age (`without_wrapper_prefix`)."""
    dst.load_state_dict(without_wrapper_prefix(src), strict=True)


def load_engine(engine, ckpt: Path, *, cfg: Optional[Config] = None, world_size: int = 1, rank: int = 0) -> bool:
    """Load checkpoint `ckpt`'s engine state (collective). `cfg` and `world_size` describe this run:
    a checkpoint written at another data-parallel size is loaded through DeepSpeed's universal form
    (`fsframework.train.resize`); another sequence-parallel size or ZeRO stage is refused naming what
    differs. Every file is read with `weights_only=True`. Returns whether the layout was the same."""
    source, universal = ckpt, False
    if cfg is not None:
        saved, now = resize.saved_layout(ckpt), resize.run_layout(cfg, world_size)
        resize.check_resume_layout(ckpt, saved, now)
        same = saved.world_size == now.world_size
        if resize.needs_universal(saved, now):
            source, universal = resize.universal_dir(ckpt), True
            if rank == 0:
                resize.universal_copy(ckpt, source)
            barrier()
    else:
        same = True
    config = engine._config  # DeepSpeed reads the flag at load time only
    flag = config.load_universal_checkpoint
    config.load_universal_checkpoint = universal
    try:
        with weights_only_loads():
            path, _ = engine.load_checkpoint(str(source), tag=ENGINE_TAG, load_optimizer_states=True,
                                             load_lr_scheduler_states=True, custom_load_fn=_load_module_state)
        if universal and cfg.parallel.zero_stage == 3:
            resize.repair_zero3_universal_load(engine, source)
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"could not load engine state from {ckpt / ENGINE_TAG}: {exc}") from None
    finally:
        config.load_universal_checkpoint = flag
        if universal:
            barrier()
            if rank == 0:
                shutil.rmtree(source, ignore_errors=True)
    if path is None:
        raise CheckpointError(f"no engine state found in {ckpt / ENGINE_TAG}")
    return same
