"""The layout of run directories and checkpoints: file names, the manifest check, and which
checkpoint a path means.

A run directory (`RunDir`) holds:

    config.yaml              the resolved config of the run (schema_version recorded)
    metrics.jsonl            one JSON record per logged step
    tensorboard/             tensorboard scalars
    data_cache/              the streaming datasets' local cache
    eval/scores.json         `fsf eval` scores (and plots next to it)
    checkpoints/             see below

Layout of `<run_dir>/checkpoints/`:

    step_00000020/           one complete checkpoint (`Checkpoint`)
        ds/                  DeepSpeed engine state (model, optimizer, schedule; ZeRO shards)
        latest               "ds": DeepSpeed's tools find ds/ by it (`python zero_to_fp32.py . OUT`)
        zero_to_fp32.py      DeepSpeed's own consolidation script (ZeRO 1-3 runs; it copies it here)
        client_rank0.pt      loop state of rank 0: step, tokens, data-loader position, RNG states
        config.yaml          the resolved config that produced it
        tokenizer.json       the run's file tokenizer, when it has one (.json or .model)
        model_fp32.pt        consolidated fp32 weights (`write_fp32_model`; read when present)
        calibration.json     FS-B's per-head thresholds, once `fsf calibrate` wrote them (+ its heat map)
        MANIFEST.json        every file with its size and xxh64 digest; written last, its presence
                             marks completeness (`writing.write_manifest`, checked by `verify`)
    latest                   name of the newest complete checkpoint (replaced atomically)
    .tmp-step_00000030/      a checkpoint being written (ignored, cleaned up on the next save)

An export directory (`fsf export`, docs/export.md) is read as a checkpoint too: it holds
config.yaml, the tokenizer and calibration.json under the same names, and its weights in
model.safetensors (Llama names for tfpp) instead of an engine state.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from fsframework.config import Config, load_run_config
from fsframework.quiet import UserFacingWarning

MANIFEST = "MANIFEST.json"
CONFIG_FILE = "config.yaml"  # in a run directory and in every checkpoint
ENGINE_TAG = "ds"  # DeepSpeed's tag: the engine state lives in `<checkpoint>/ds/`
FP32_FILE = "model_fp32.pt"
LATEST = "latest"
CALIBRATION_FILE = "calibration.json"  # FS-B thresholds of a checkpoint (fsframework.eval.calibrate)
STEP_PREFIX = "step_"
TMP_PREFIX = ".tmp-"
# A file tokenizer is saved in every checkpoint under this stem (suffix kept: .json or .model).
TOKENIZER_STEM = "tokenizer"
# An export directory (fsframework.export): Hugging Face-style config and safetensors weights.
EXPORT_WEIGHTS = "model.safetensors"
EXPORT_HF_CONFIG = "config.json"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt, or its weights do not fit the model."""


class CheckpointWriteFailed(RuntimeError):
    """A checkpoint could not be written (a full disk, a quota, a lost mount): the run stops, its
    partial files removed and the previous checkpoint intact (`fsframework.checkpoints.writing.save`)."""


class CheckpointWarning(UserFacingWarning):
    """A damaged checkpoint was skipped in favour of an older one."""


def step_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


def client_state_name(rank: int) -> str:
    return f"client_rank{rank}.pt"


@dataclass(frozen=True)
class RunDir:
    """The files of one run directory (paths only; nothing is created)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def config(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def data_cache(self) -> Path:
        return self.root / "data_cache"

    @property
    def eval_dir(self) -> Path:
        return self.root / "eval"

    @property
    def scores(self) -> Path:
        return self.eval_dir / "scores.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def latest(self) -> Path:
        return self.checkpoints / LATEST

    def step(self, step: int) -> Path:
        return self.checkpoints / step_name(step)

    @classmethod
    def of_checkpoint(cls, ckpt: Path) -> "RunDir":
        """The run directory a checkpoint directory belongs to (`<run>/checkpoints/step_N`)."""
        ckpt = Path(ckpt)
        return cls(ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent)

    @classmethod
    def holding_config(cls, path: Path) -> Optional["RunDir"]:
        """The run directory whose saved config.yaml `path` is (one with a checkpoints/ folder),
        else None: such a file is read with `read_config` (migrated), not as a job file."""
        path = Path(path)
        run = cls(path.parent)
        return run if path.name == CONFIG_FILE and run.checkpoints.is_dir() else None


def read_config(path: str | Path, overrides: Optional[list[str]] = None) -> "Config":
    """A config.yaml saved by a run (run directory or checkpoint), older schema versions migrated;
    `path` may name the run or checkpoint directory instead of the file."""
    path = Path(path)
    return load_run_config(path / CONFIG_FILE if path.is_dir() else path, overrides)


def checkpoint_tokenizer(ckpt: Path, spec: str) -> str:
    """The tokenizer of checkpoint `ckpt` whose config names `spec`: the copy saved in the
    checkpoint, else (checkpoints written before tokenizers were saved) `spec` itself."""
    if spec == "byte":
        return spec
    saved = ckpt / f"{TOKENIZER_STEM}{Path(spec).suffix}"
    return str(saved) if saved.is_file() else spec


def is_export(path: Path) -> bool:
    """Whether `path` is an export directory (`fsf export`): config.json, config.yaml and
    model.safetensors, no engine state."""
    path = Path(path)
    return all((path / name).is_file() for name in (EXPORT_HF_CONFIG, CONFIG_FILE, EXPORT_WEIGHTS))


def training_step(path: Path) -> int:
    """The optimizer step a checkpoint or export holds: NNN of a folder `step_NNN`; for an export,
    the step its config.json records (`fsf export` keeps its source's); else 0."""
    path = Path(path)
    digits = path.name.rpartition("_")[2]
    if path.name.startswith(STEP_PREFIX) and digits.isdigit():
        return int(digits)
    if is_export(path):
        return int(json.loads((path / EXPORT_HF_CONFIG).read_text()).get("fsframework", {}).get("step", 0))
    return 0


def file_digest(path: Path) -> str:
    """xxh64 of a file's bytes (hex), read in 16 MiB pieces: fast enough to check every file of a
    checkpoint on resume, and unlike a size it catches bytes overwritten in place."""
    import xxhash

    digest = xxhash.xxh64()
    with open(path, "rb") as f:
        for piece in iter(lambda: f.read(1 << 24), b""):
            digest.update(piece)
    return digest.hexdigest()


def verify(ckpt: Path) -> None:
    """Raise CheckpointError naming what is wrong with checkpoint directory `ckpt`: a missing
    manifest, or a listed file that is missing, of another size or (manifests that record one)
    of another xxh64 digest."""
    manifest = ckpt / MANIFEST
    if not manifest.is_file():
        raise CheckpointError(f"checkpoint {ckpt} is incomplete: {MANIFEST} is missing")
    try:
        files = json.loads(manifest.read_text())["files"]
    except (json.JSONDecodeError, KeyError) as exc:
        raise CheckpointError(f"checkpoint {ckpt}: unreadable {MANIFEST} ({exc})") from None
    for rel, entry in files.items():
        # older manifests record the size alone
        size, digest = (entry, None) if isinstance(entry, int) else (entry["size"], entry.get("xxh64"))
        path = ckpt / rel
        if not path.is_file():
            raise CheckpointError(f"checkpoint {ckpt}: file {rel} is missing")
        if path.stat().st_size != size:
            raise CheckpointError(f"checkpoint {ckpt}: file {rel} has {path.stat().st_size} bytes, expected {size}")
        if digest is not None and file_digest(path) != digest:
            raise CheckpointError(f"checkpoint {ckpt}: file {rel} is corrupt (its xxh64 digest differs from the "
                                  "manifest's)")


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete-looking checkpoint directories, oldest first."""
    if not ckpt_root.is_dir():
        return []
    return sorted(p for p in ckpt_root.iterdir() if p.is_dir() and p.name.startswith(STEP_PREFIX))


def find_latest(ckpt_root: Path, log: Callable[[str], Any] = print) -> Optional[Path]:
    """The checkpoint named by `latest` if it verifies, else the newest one that does."""
    candidates = list_checkpoints(ckpt_root)
    pointer = ckpt_root / LATEST
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


def resolve_checkpoint(path: str | Path) -> Path:
    """A run directory, its checkpoints/ folder, one checkpoint or an export directory -> one
    verified checkpoint dir (an export's tensors are checked when they are read). A damaged newer
    checkpoint is skipped with a CheckpointWarning that names it and what is wrong with it, and
    another that names the checkpoint used instead."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint path not found: {path}")
    if is_export(path):
        return path
    if (path / MANIFEST).is_file():
        verify(path)
        return path
    for root in (RunDir(path).checkpoints, path):
        skipped: list[str] = []
        found = find_latest(root, log=skipped.append)
        for message in skipped:  # a damaged newer checkpoint is named, never passed over silently
            warnings.warn(message, CheckpointWarning, stacklevel=2)
        if found is not None:
            if skipped:
                warnings.warn(f"using checkpoint {found}, the newest that verifies", CheckpointWarning, stacklevel=2)
            return found
    raise CheckpointError(f"no complete checkpoint under {path}")
