"""Resuming a checkpoint at another data-parallel size (docs/checkpoints.md).

DeepSpeed stores ZeRO 1-3 optimizer state in one flat shard per rank, cut for the world size that
wrote it, and refuses to load it at another size. Its universal form stores every parameter's
fp32 weights and Adam moments whole (`<param>/fp32.pt, exp_avg.pt, exp_avg_sq.pt`), and any world
size cuts its own shards from that: `universal_copy` writes that form of a checkpoint's engine
state (`deepspeed.checkpoint.ds_to_universal`), and the engine loads it with DeepSpeed's
`load_universal_checkpoint`. ZeRO-0 keeps the whole optimizer state in the model-state file,
which loads at any size as it is.

The loop state is global already: the step, the token count and the data loader's position (a
sample count over all ranks; mosaicml-streaming re-deals samples to any number of ranks), so
every rank of the new layout takes rank 0's.

What does not change on resume: `parallel.sp` (it decides how ranks split sequences) and
`parallel.zero_stage` (it decides the files' layout). `check_resume_layout` refuses either, naming
what differs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
from dataclasses import dataclass
from pathlib import Path

from fsframework.checkpoints import (ENGINE_TAG, TMP_PREFIX, CheckpointError, client_state_name, read_config,
                                     safe_load, weights_only_loads, without_wrapper_prefix)
from fsframework.config import Config


@dataclass(frozen=True)
class Layout:
    """How a run spreads over ranks: `world_size` ranks in `sp`-rank sequence-parallel groups."""

    world_size: int
    sp: int
    zero_stage: int

    @property
    def dp(self) -> int:
        return self.world_size // self.sp

    def describe(self) -> str:
        return f"{self.world_size} rank(s): data-parallel {self.dp} x parallel.sp={self.sp}, " \
               f"parallel.zero_stage={self.zero_stage}"


def saved_layout(ckpt: Path) -> Layout:
    """The layout that wrote checkpoint `ckpt`: one loop-state file per rank, and its config."""
    world = 0
    while (ckpt / client_state_name(world)).is_file():
        world += 1
    if world == 0:
        raise CheckpointError(f"checkpoint {ckpt} has no loop state ({client_state_name(0)})")
    try:
        parallel = read_config(ckpt).parallel
    except (OSError, ValueError) as exc:  # ConfigError is a ValueError
        raise CheckpointError(f"checkpoint {ckpt}: its config.yaml cannot be read ({exc})") from None
    return Layout(world, parallel.sp, parallel.zero_stage)


def run_layout(cfg: Config, world_size: int) -> Layout:
    return Layout(world_size, cfg.parallel.sp, cfg.parallel.zero_stage)


def check_resume_layout(ckpt: Path, saved: Layout, now: Layout) -> None:
    """Raise CheckpointError naming what differs when this run cannot resume `ckpt`: another
    sequence-parallel size or another ZeRO stage. Another data-parallel size is fine."""
    differs = []
    if saved.sp != now.sp:
        differs.append(f"parallel.sp={saved.sp} in the checkpoint, {now.sp} in this run")
    if saved.zero_stage != now.zero_stage:
        differs.append(f"parallel.zero_stage={saved.zero_stage} in the checkpoint, {now.zero_stage} in this run")
    if differs:
        raise CheckpointError(f"cannot resume {ckpt} ({saved.describe()}) with {now.describe()}: "
                              f"{'; '.join(differs)}. Only the data-parallel size may change on resume; "
                              "resume with the checkpoint's settings, or start a new run from its weights "
                              "(train.init_from, fresh optimizer)")


def needs_universal(saved: Layout, now: Layout) -> bool:
    """ZeRO 1-3 shards are cut for the world size that wrote them; another size reads the
    universal form. ZeRO-0 keeps everything whole."""
    return saved.world_size != now.world_size and saved.zero_stage > 0


def universal_dir(ckpt: Path) -> Path:
    """Where `universal_copy` writes for checkpoint `ckpt`: a temporary folder next to it, which
    `list_checkpoints` ignores and the next save clears if a run dies before removing it."""
    return ckpt.parent / f"{TMP_PREFIX}universal-{ckpt.name}"


def universal_copy(ckpt: Path, out: Path) -> Path:
    """Write the universal form of `ckpt`'s engine state to `out/ds` (DeepSpeed's `ds_to_universal`,
    its files read through `safe_load`); return `out`. Run on one rank."""
    from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    args = argparse.Namespace(input_folder=str(ckpt / ENGINE_TAG), output_folder=str(out / ENGINE_TAG),
                              num_extract_workers=1, num_merge_workers=1, keep_temp_folder=False, strict=True,
                              # our engine states carry no Megatron-style `universal_checkpoint_info`
                              inject_missing_state=True)
    report = io.StringIO()  # the converter prints its progress; kept for the error message only
    try:
        with weights_only_loads(), contextlib.redirect_stdout(report), contextlib.redirect_stderr(report):
            ds_to_universal(args)
    except CheckpointError:
        raise
    except Exception as exc:
        shutil.rmtree(out, ignore_errors=True)
        raise CheckpointError(f"could not convert the engine state of {ckpt} to DeepSpeed's universal form for "
                              f"another data-parallel size ({type(exc).__name__}: {exc})\n{report.getvalue()[-2000:]}"
                              ) from None
    _name_as_the_model(out / ENGINE_TAG / "zero")
    return out


def _name_as_the_model(zero: Path) -> None:
    """Rename the universal form's folders (one per parameter, named as in the engine state) to the
    model's names: an older checkpoint's carry the wrapper prefix (`without_wrapper_prefix`)."""
    folders = {folder.name: folder for folder in zero.iterdir() if folder.is_dir()}
    for name, folder in without_wrapper_prefix(folders).items():
        if folder.name != name:
            folder.rename(zero / name)


def repair_zero3_universal_load(engine, universal: Path) -> None:
    """Undo two slips of DeepSpeed's ZeRO-3 universal loader (both found by comparing a resized
    resume with a run that never changed size, docs/checkpoints.md):

    - it gives every optimizer parameter group the first group's settings, so the matrices'
      weight decay would reach the norms, gains and biases, which the trainer exempts;
    - it hands every group one shared `step` tensor, which AdamW increments in place once per
      group: the bias correction of the later groups then runs ahead by a step per step.

    Either moves the loss by about 1e-4 within three steps at the tests' sizes. The converted state
    keeps every group's settings; each group gets them back and a `step` of its own."""
    saved = safe_load(universal / ENGINE_TAG / "zero" / "optimizer_state.pt", engine=True)
    groups = saved["optimizer_state_dict"]["param_groups"]
    if len(groups) != len(engine.optimizer.param_groups):
        raise CheckpointError(f"the universal form of the checkpoint has {len(groups)} optimizer parameter groups, "
                              f"this run's optimizer {len(engine.optimizer.param_groups)}")
    for group, settings in zip(engine.optimizer.param_groups, groups):
        group.update({key: value for key, value in settings.items() if key != "params"})
    for state in engine.optimizer.optimizer.state.values():
        if "step" in state and hasattr(state["step"], "clone"):
            state["step"] = state["step"].clone()
