"""Writing checkpoints: atomic save with exact resume, manifest, pruning.

The layout of run directories and checkpoints, and the read side (resolve, verify, consolidate,
load a model) are in `fsframework.checkpoints`.

A checkpoint is written under a temporary name and renamed into place only
after every rank has finished and the manifest is on disk, so a kill at any
moment leaves the previous checkpoint intact and `latest` pointing at it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from fsframework.checkpoints import (CONFIG_FILE, ENGINE_TAG, LATEST, MANIFEST, TMP_PREFIX, TOKENIZER_STEM,
                                     CheckpointError, client_state_name, file_digest, list_checkpoints, safe_load,
                                     step_name, verify, weights_only_loads, without_wrapper_prefix)
from fsframework.config import Config
from fsframework.parallel.process_group import barrier

# Fault injection for tests: die after the engine state is written, before the rename.
CRASH_ENV = "FSF_CRASH_DURING_CHECKPOINT_STEP"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


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


def _write_manifest(ckpt: Path) -> None:
    """Size and xxh64 digest of every file, written last: its presence marks a complete checkpoint."""
    files = {}
    for p in sorted(ckpt.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
            files[str(p.relative_to(ckpt))] = {"size": p.stat().st_size, "xxh64": file_digest(p)}
    atomic_write_text(ckpt / MANIFEST, json.dumps({"files": files}, indent=1))


def prune(ckpt_root: Path, keep: int, protect: Optional[Path] = None, fresh: Optional[Path] = None) -> list[Path]:
    """Delete old checkpoints; return what was deleted. Kept: the newest `keep` checkpoints that
    verify (a damaged one never counts towards `keep`, so it can never push out a good one),
    `protect` (the checkpoint this run resumed from), and anything newer than the oldest kept one
    (a damaged newer checkpoint stays for inspection; the next save at its step replaces it).
    `fresh`, the checkpoint just written with its manifest, counts as verified without re-reading it."""
    checkpoints = list_checkpoints(ckpt_root)
    good = []
    for ckpt in reversed(checkpoints):
        if len(good) == keep:
            break
        try:
            if ckpt != fresh:
                verify(ckpt)
            good.append(ckpt)
        except CheckpointError:
            pass
    if len(good) < keep:  # fewer good checkpoints than asked for: delete nothing
        return []
    oldest_kept = good[-1]
    doomed = [c for c in checkpoints if c < oldest_kept and c != protect]
    for old in doomed:
        shutil.rmtree(old, ignore_errors=True)
    return doomed


def save(engine, ckpt_root: Path, step: int, client_state: dict[str, Any], config_yaml: str, *, rank: int,
         keep: int, tokenizer: Optional[tuple[str, bytes]] = None, protect: Optional[Path] = None) -> Path:
    """Write checkpoint `step` atomically (collective: every rank calls it), then prune to the
    newest `keep` verified checkpoints, never deleting `protect` (see `prune`). `tokenizer`, from
    `read_tokenizer`, is written in too."""
    name = step_name(step)
    tmp = ckpt_root / f"{TMP_PREFIX}{name}"
    final = ckpt_root / name
    if rank == 0:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        for stale in ckpt_root.glob(f"{TMP_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    barrier()
    engine.save_checkpoint(str(tmp), tag=ENGINE_TAG, save_latest=False)
    torch.save(client_state, tmp / client_state_name(rank))
    if os.environ.get(CRASH_ENV) == str(step):
        os._exit(17)
    barrier()
    if rank == 0:
        (tmp / CONFIG_FILE).write_text(config_yaml)
        # DeepSpeed's tools (the zero_to_fp32.py it copies here, load_checkpoint without a tag) find
        # the engine's folder through a `latest` file beside it: `python zero_to_fp32.py . OUT` works
        (tmp / LATEST).write_text(ENGINE_TAG)
        save_tokenizer(tokenizer, tmp)
        _write_manifest(tmp)
        if final.exists():  # a re-save of the same step after a resume
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(ckpt_root)
        atomic_write_text(ckpt_root / LATEST, name)
        prune(ckpt_root, keep, protect, fresh=final)
    barrier()
    return final


def read_tokenizer(spec: str) -> Optional[tuple[str, bytes]]:
    """(file name in a checkpoint, contents) of a file tokenizer; None for `byte`. Read once when
    training starts, so a missing file stops the run before any step instead of at its first
    checkpoint. Saved with every checkpoint (`save_tokenizer`): evaluating or converting it then
    does not depend on the training run's paths or working directory (a config names the
    tokenizer by a path, often a relative one)."""
    if spec == "byte":
        return None
    source = Path(spec)
    if not source.is_file():
        raise CheckpointError(f"tokenizer file {spec} (data.tokenizer) not found; it is saved with every checkpoint")
    return f"{TOKENIZER_STEM}{source.suffix}", source.read_bytes()


def save_tokenizer(tokenizer: Optional[tuple[str, bytes]], ckpt: Path) -> None:
    """Write a tokenizer from `read_tokenizer` into checkpoint dir `ckpt` (nothing for `byte`)."""
    if tokenizer is not None:
        name, contents = tokenizer
        (ckpt / name).write_bytes(contents)


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
    from fsframework.train import resize

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
