"""Atomic checkpoints with exact resume.

Layout of `<run_dir>/checkpoints/`:

    step_00000020/           one complete checkpoint
        ds/                  DeepSpeed engine state (model, optimizer, schedule; ZeRO shards)
        client_rank0.pt      loop state of rank 0: step, tokens, data-loader position, RNG states
        config.yaml          the resolved config that produced it
        MANIFEST.json        every file with its size; written last, its presence marks completeness
    latest                   name of the newest complete checkpoint (replaced atomically)
    .tmp-step_00000030/      a checkpoint being written (ignored, cleaned up on the next save)

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

from fsframework.train.distributed import barrier  # noqa: F401  (re-exported for the trainer)

MANIFEST = "MANIFEST.json"
# A file tokenizer is saved in every checkpoint under this stem (suffix kept: .json or .model).
TOKENIZER_STEM = "tokenizer"
# Fault injection for tests: die after the engine state is written, before the rename.
CRASH_ENV = "FSF_CRASH_DURING_CHECKPOINT_STEP"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt."""


def step_name(step: int) -> str:
    return f"step_{step:08d}"


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
    files = {str(p.relative_to(ckpt)): p.stat().st_size for p in sorted(ckpt.rglob("*")) if p.is_file()}
    for p in ckpt.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    atomic_write_text(ckpt / MANIFEST, json.dumps({"files": files}, indent=1))


def verify(ckpt: Path) -> None:
    """Raise CheckpointError naming what is wrong with checkpoint directory `ckpt`."""
    manifest = ckpt / MANIFEST
    if not manifest.is_file():
        raise CheckpointError(f"checkpoint {ckpt} is incomplete: {MANIFEST} is missing")
    try:
        files = json.loads(manifest.read_text())["files"]
    except (json.JSONDecodeError, KeyError) as exc:
        raise CheckpointError(f"checkpoint {ckpt}: unreadable {MANIFEST} ({exc})") from None
    for rel, size in files.items():
        path = ckpt / rel
        if not path.is_file():
            raise CheckpointError(f"checkpoint {ckpt}: file {rel} is missing")
        if path.stat().st_size != size:
            raise CheckpointError(f"checkpoint {ckpt}: file {rel} has {path.stat().st_size} bytes, expected {size}")


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete-looking checkpoint directories, oldest first."""
    if not ckpt_root.is_dir():
        return []
    return sorted(p for p in ckpt_root.iterdir() if p.is_dir() and p.name.startswith("step_"))


def find_latest(ckpt_root: Path, log=print) -> Optional[Path]:
    """The checkpoint named by `latest` if it verifies, else the newest one that does."""
    candidates = list_checkpoints(ckpt_root)
    pointer = ckpt_root / "latest"
    if pointer.is_file():
        named = ckpt_root / pointer.read_text().strip()
        if named in candidates:
            candidates.remove(named)
            candidates.append(named)
    for ckpt in reversed(candidates):
        try:
            verify(ckpt)
            return ckpt
        except CheckpointError as exc:
            log(f"skipping checkpoint: {exc}")
    return None


def save(engine, ckpt_root: Path, step: int, client_state: dict[str, Any], config_yaml: str, *, rank: int,
         keep: int, tokenizer: Optional[tuple[str, bytes]] = None) -> Path:
    """Write checkpoint `step` atomically (collective: every rank calls it). `tokenizer`, from
    `read_tokenizer`, is written in too."""
    name = step_name(step)
    tmp = ckpt_root / f".tmp-{name}"
    final = ckpt_root / name
    if rank == 0:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        for stale in ckpt_root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    barrier()
    engine.save_checkpoint(str(tmp), tag="ds", save_latest=False)
    torch.save(client_state, tmp / f"client_rank{rank}.pt")
    if os.environ.get(CRASH_ENV) == str(step):
        os._exit(17)
    barrier()
    if rank == 0:
        (tmp / "config.yaml").write_text(config_yaml)
        save_tokenizer(tokenizer, tmp)
        _write_manifest(tmp)
        if final.exists():  # a re-save of the same step after a resume
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(ckpt_root)
        atomic_write_text(ckpt_root / "latest", name)
        for old in list_checkpoints(ckpt_root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
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


def checkpoint_tokenizer(ckpt: Path, spec: str) -> str:
    """The tokenizer of checkpoint `ckpt` whose config names `spec`: the copy saved in the
    checkpoint, else (checkpoints written before tokenizers were saved) `spec` itself."""
    if spec == "byte":
        return spec
    saved = ckpt / f"{TOKENIZER_STEM}{Path(spec).suffix}"
    return str(saved) if saved.is_file() else spec


def load_client_state(ckpt: Path, rank: int) -> dict[str, Any]:
    path = ckpt / f"client_rank{rank}.pt"
    if not path.is_file():
        raise CheckpointError(f"checkpoint {ckpt} has no loop state for rank {rank} ({path.name}); "
                              "was it written with a different number of ranks?")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # torch raises several types for a damaged file
        raise CheckpointError(f"checkpoint file {path} is corrupt: {exc}") from None


def load_engine(engine, ckpt: Path) -> None:
    try:
        path, _ = engine.load_checkpoint(str(ckpt), tag="ds", load_optimizer_states=True,
                                         load_lr_scheduler_states=True)
    except Exception as exc:
        raise CheckpointError(f"could not load engine state from {ckpt / 'ds'}: {exc}") from None
    if path is None:
        raise CheckpointError(f"no engine state found in {ckpt / 'ds'}")


def resolve_checkpoint(path: str | Path) -> Path:
    """A run directory, its checkpoints/ folder or one checkpoint -> one verified checkpoint dir."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint path not found: {path}")
    if (path / MANIFEST).is_file():
        verify(path)
        return path
    for root in (path / "checkpoints", path):
        found = find_latest(root, log=lambda _m: None)
        if found is not None:
            return found
    raise CheckpointError(f"no complete checkpoint under {path}")


def consolidated_state_dict(ckpt: Path) -> dict[str, torch.Tensor]:
    """fp32 model weights of a checkpoint (any ZeRO stage), keys as in the plain model."""
    from fsframework.train.distributed import setup_environment

    setup_environment()
    ds_dir = ckpt / "ds"
    if (ckpt / "model_fp32.pt").is_file():
        state = torch.load(ckpt / "model_fp32.pt", map_location="cpu", weights_only=True)
    elif any(ds_dir.glob("zero_pp_rank_*_mp_rank_*_optim_states.pt")) and not _has_full_module(ds_dir):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state = get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag="ds")
    else:
        files = sorted(ds_dir.glob("mp_rank_*_model_states.pt"))
        if not files:
            raise CheckpointError(f"checkpoint {ckpt}: no model states in {ds_dir}")
        try:
            state = torch.load(files[0], map_location="cpu", weights_only=False)["module"]
        except Exception as exc:
            raise CheckpointError(f"checkpoint file {files[0]} is corrupt: {exc}") from None
    prefix = "model."
    return {k[len(prefix):] if k.startswith(prefix) else k: v.float() for k, v in state.items()}


def initial_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Weights for `train.init_from`: a run directory or checkpoint (as `resolve_checkpoint`), or
    one `.pt` file holding a plain state dict, bare or under "model" (what
    `tools/copy_drill.py --save` writes), so a model trained outside the trainer can start a run."""
    path = Path(path)
    if not path.is_file():
        return consolidated_state_dict(resolve_checkpoint(path))
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"weights file {path} is not a readable torch file: {exc}") from None
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"weights file {path} holds no state dict (name -> tensor)")
    return {k: v.float() for k, v in state.items()}


def _has_full_module(ds_dir: Path) -> bool:
    files = sorted(ds_dir.glob("mp_rank_*_model_states.pt"))
    if not files:
        return False
    module = torch.load(files[0], map_location="cpu", weights_only=False).get("module")
    return bool(module) and all(t.numel() > 0 for t in module.values())


def load_model(path: str | Path, device: str | torch.device = "cpu", overrides: Optional[list[str]] = None):
    """(model, config) from a run directory or checkpoint, weights in fp32, eval mode. The
    config's `data.tokenizer` names the checkpoint's saved copy of its tokenizer when it has one."""
    from fsframework.config import load_config
    from fsframework.models.registry import build_model

    ckpt = resolve_checkpoint(path)
    cfg = load_config(ckpt / "config.yaml", overrides)
    cfg.data.tokenizer = checkpoint_tokenizer(ckpt, cfg.data.tokenizer)
    model = build_model(cfg.model)
    missing, unexpected = model.load_state_dict(consolidated_state_dict(ckpt), strict=False)
    missing = [k for k in missing if not k.endswith("lm_head.weight") or not cfg.model.tie_embeddings]
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {ckpt} does not match model {cfg.model.name}: "
                              f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model.to(device).eval(), cfg


def write_fp32_model(path: str | Path) -> Path:
    """Consolidate a checkpoint (any ZeRO stage, any number of ranks) into `<ckpt>/model_fp32.pt`.

    `path`: a run directory or checkpoint. The file holds the plain model's fp32
    state dict (keys as in `build_model`), which `load_model` and `fsf eval` then read
    directly instead of merging ZeRO shards each time. Written atomically.
    """
    ckpt = resolve_checkpoint(path)
    state = consolidated_state_dict(ckpt)
    out = ckpt / "model_fp32.pt"
    tmp = out.with_name(out.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, out)
    return out
