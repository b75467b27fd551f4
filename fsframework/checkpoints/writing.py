"""Writing checkpoints (the layout is in `fsframework.checkpoints.layout`): atomic save, manifest,
pruning, the tokenizer file.

A checkpoint is written under a temporary name and renamed into place only
after every rank has finished and the manifest is on disk, so a kill at any
moment leaves the previous checkpoint intact and `latest` pointing at it.
Loading one back into a training run (engine state, loop state) is `fsframework.train.resume`'s.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from fsframework.checkpoints.layout import (CONFIG_FILE, ENGINE_TAG, LATEST, MANIFEST, TMP_PREFIX, TOKENIZER_STEM,
                                            CheckpointError, CheckpointWriteFailed, client_state_name, file_digest,
                                            list_checkpoints, step_name, verify)
from fsframework.parallel.process_group import barrier, max_over_ranks

# Fault injection for tests: die after the engine state is written, before the rename.
CRASH_ENV = "FSF_CRASH_DURING_CHECKPOINT_STEP"
# Fault injection for tests where no small filesystem can be mounted: the disk is full when this
# step's checkpoint is written (rank 0's files fail with ENOSPC).
FULL_DISK_ENV = "FSF_FULL_DISK_AT_CHECKPOINT_STEP"


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


def write_manifest(ckpt: Path) -> None:
    """Size and xxh64 digest of every file (what `verify` checks), written last: its presence marks
    a complete checkpoint."""
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
    # a write that fails (a full disk) fails on some ranks only: every rank learns of it in
    # `_every_rank_wrote` (in place of a barrier) and stops, rather than wait for the others forever
    failure = _written(lambda: _write_states(engine, tmp, client_state, rank, step))
    if os.environ.get(CRASH_ENV) == str(step):
        os._exit(17)
    _every_rank_wrote(failure, tmp, ckpt_root, name, rank)
    if rank == 0:
        def finish() -> None:
            (tmp / CONFIG_FILE).write_text(config_yaml)
            # DeepSpeed's tools (the zero_to_fp32.py it copies here, load_checkpoint without a tag) find
            # the engine's folder through a `latest` file beside it: `python zero_to_fp32.py . OUT` works
            (tmp / LATEST).write_text(ENGINE_TAG)
            save_tokenizer(tokenizer, tmp)
            write_manifest(tmp)

        failure = _written(finish)
    _every_rank_wrote(failure, tmp, ckpt_root, name, rank)
    if rank == 0:
        if final.exists():  # a re-save of the same step after a resume
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(ckpt_root)
        atomic_write_text(ckpt_root / LATEST, name)
        prune(ckpt_root, keep, protect, fresh=final)
    barrier()
    return final


def _write_states(engine, tmp: Path, client_state: dict[str, Any], rank: int, step: int) -> None:
    """This rank's part of checkpoint `tmp`: the engine's state (DeepSpeed's files) and the loop's."""
    if rank == 0 and os.environ.get(FULL_DISK_ENV) == str(step):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp / client_state_name(rank)))
    engine.save_checkpoint(str(tmp), tag=ENGINE_TAG, save_latest=False)
    torch.save(client_state, tmp / client_state_name(rank))


def _written(write: Callable[[], None]) -> Optional[BaseException]:
    """None when `write()` wrote, else its error: an OSError (ENOSPC, EDQUOT, EIO) or the RuntimeError
    torch's archive writer raises for one (`PytorchStreamWriter failed writing file`)."""
    try:
        write()
    except (OSError, RuntimeError) as exc:
        return exc
    return None


def _every_rank_wrote(failure: Optional[BaseException], tmp: Path, ckpt_root: Path, name: str, rank: int) -> None:
    """A barrier that also tells every rank whether any rank's write failed; if one did, rank 0 removes
    the partial checkpoint and every rank raises CheckpointWriteFailed (one line: where, why, how much
    space a checkpoint takes, what survives)."""
    failed = bool(max_over_ranks(int(failure is not None)))
    if not failed:
        return
    written = _size(tmp)
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    barrier()
    previous = [c for c in list_checkpoints(ckpt_root) if c.name != name]
    need = _size(previous[-1]) if previous else written
    free = shutil.disk_usage(ckpt_root).free
    why = (os.strerror(failure.errno) if isinstance(failure, OSError) and failure.errno else str(failure).splitlines()[0]
           ) if failure is not None else "another rank's write failed"
    kept = (f"the previous checkpoint {previous[-1].name} is intact; a rerun resumes from it" if previous
            else "there is no earlier checkpoint; a rerun starts from step 0")
    raise CheckpointWriteFailed(
        f"checkpoint {name} could not be written to {ckpt_root}: {why}. A checkpoint of this run takes about "
        f"{need / 2**20:,.1f} MiB ({free / 2**20:,.1f} MiB free there); its partial files are removed and {kept} "
        "once there is space")


def _size(path: Path) -> int:
    """Bytes of the files under `path` (0 when it is gone)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


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
