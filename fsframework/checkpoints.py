"""Run directories and checkpoints: the names of their files, and the read side.

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
        MANIFEST.json        every file with its size; written last, its presence marks completeness
    latest                   name of the newest complete checkpoint (replaced atomically)
    .tmp-step_00000030/      a checkpoint being written (ignored, cleaned up on the next save)

An export directory (`fsf export`, docs/export.md) is read as a checkpoint too: it holds
config.yaml, the tokenizer and calibration.json under the same names, and its weights in
model.safetensors (Llama names for tfpp) instead of an engine state; `Checkpoint` reads either.

Writing checkpoints (atomic save, manifest, pruning) is `fsframework.train.checkpoint`'s;
this module resolves a path to one verified checkpoint, reads its config (migrated to the
current schema) and consolidates its weights into one fp32 state dict, each once.
Torch and DeepSpeed are imported where they are used.
"""

from __future__ import annotations

import json
import os
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from fsframework.config import Config

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
    """A checkpoint is missing, incomplete or corrupt."""


class CheckpointWarning(UserWarning):
    """A damaged checkpoint was skipped in favour of an older one."""


# Safe loading (docs/checkpoints.md): every torch file is read with `weights_only=True`, which
# unpickles tensors and plain containers only, plus the allow-list below; a file holding anything
# else is refused, so loading a checkpoint never runs code from it.
def _deepspeed_safe_globals() -> list:
    """The three small classes DeepSpeed's optimizer files hold (found by loading the files of
    ZeRO 0-3, fp32 and bf16 runs); the model-state files hold tensors and containers only."""
    _deepspeed_environment()
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]


def _numpy_safe_globals() -> list:
    """What a numpy array pickles to (torch's own recipe for such files): the loop state holds
    numpy's generator state, an array."""
    import numpy as np

    core = np._core if hasattr(np, "_core") else np.core
    return [np.ndarray, np.dtype, type(np.dtype(np.uint32)), core.multiarray._reconstruct]


# torch.load itself while `weights_only_loads` has replaced it (empty outside such a block)
_ORIGINAL_TORCH_LOAD: dict[str, Callable] = {}


def safe_load(path: str | Path, *, what: str = "checkpoint file", engine: bool = False, map_location: Any = "cpu",
              **kwargs: Any) -> Any:
    """`torch.load(path, weights_only=True)` with the allow-list (`engine`: DeepSpeed's classes
    too); any failure (truncated or corrupt file, a class outside the allow-list) raises
    CheckpointError naming the file as `what`."""
    import torch

    allowed = _numpy_safe_globals() + (_deepspeed_safe_globals() if engine else [])
    load = _ORIGINAL_TORCH_LOAD.get("load", torch.load)  # the real one inside `weights_only_loads`
    with torch.serialization.safe_globals(allowed):
        try:
            return load(path, map_location=map_location, weights_only=True, **kwargs)
        except FileNotFoundError:
            raise CheckpointError(f"{what} {path} does not exist") from None
        except Exception as exc:  # torch raises several types for a damaged file
            lines = str(exc).strip().splitlines()
            reason = next((line.strip() for line in lines if "Unsupported global" in line), lines[-1] if lines else "")
            raise CheckpointError(f"{what} {path} is not a readable torch file of tensors "
                                  f"({type(exc).__name__}: {reason})") from None


@contextmanager
def weights_only_loads() -> Iterator[None]:
    """Within the block every `torch.load` goes through `safe_load` with DeepSpeed's classes
    allowed: DeepSpeed's own checkpoint loading and conversion, which pass `weights_only=False`,
    then unpickle nothing outside the allow-list, and a damaged file raises CheckpointError naming it."""
    import torch

    if _ORIGINAL_TORCH_LOAD:  # already inside such a block
        yield
        return
    _ORIGINAL_TORCH_LOAD["load"] = torch.load

    def load(f, map_location=None, pickle_module=None, *, weights_only=None, **kwargs):
        return safe_load(f, engine=True, map_location=map_location, **kwargs)

    torch.load = load
    try:
        yield
    finally:
        torch.load = _ORIGINAL_TORCH_LOAD.pop("load")


def check_state_dict(model, state: dict, source: str | Path, *, tied: bool = False) -> None:
    """Raise CheckpointError when `state` does not fit `model`, naming the missing, unexpected and
    mis-shaped tensors (a file of another model size or kind). `tied`: the model ties its output
    to its embedding, so a state without `lm_head.weight` still fits."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state and not (tied and k.endswith("lm_head.weight"))]
    unexpected = [k for k in state if k not in expected]
    misshaped = [f"{k} {tuple(state[k].shape)} (model: {tuple(v.shape)})" for k, v in expected.items()
                 if k in state and tuple(state[k].shape) != tuple(v.shape)]
    if missing or unexpected or misshaped:
        parts = [f"{label} {len(names)}: {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}"
                 for label, names in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped))
                 if names]
        raise CheckpointError(f"{source} does not fit the model: {'; '.join(parts)}")


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
    from fsframework.config import load_run_config

    path = Path(path)
    return load_run_config(path / CONFIG_FILE if path.is_dir() else path, overrides)


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
    if path.name.startswith("step_") and digits.isdigit():
        return int(digits)
    if is_export(path):
        return int(json.loads((path / EXPORT_HF_CONFIG).read_text()).get("fsframework", {}).get("step", 0))
    return 0


def read_export_weights(path: Path) -> dict[str, "torch.Tensor"]:
    """fp32 weights of export directory `path`, keys as in the plain model: Llama names (a tfpp
    export, model_type "llama") mapped back, the "model." prefix of the other kinds' files dropped.
    Read with safetensors (no pickle); a truncated or foreign file raises CheckpointError."""
    from safetensors.torch import load_file

    from fsframework.models.llama import from_llama_name

    file = Path(path) / EXPORT_WEIGHTS
    try:
        hf = json.loads((Path(path) / EXPORT_HF_CONFIG).read_text())
    except ValueError as exc:
        raise CheckpointError(f"export {path}: {EXPORT_HF_CONFIG} is not valid JSON ({exc})") from None
    try:
        state = load_file(file)
    except Exception as exc:  # safetensors raises its own error types for a bad header or short file
        raise CheckpointError(f"export {path}: {file.name} is truncated or not a safetensors file "
                              f"({type(exc).__name__}: {exc})") from None
    if hf.get("model_type") == "llama":
        state = {from_llama_name(k): v for k, v in state.items()}
    state = _plain_keys(state)
    if hf.get("tie_word_embeddings") and "embed.weight" in state:
        state.setdefault("lm_head.weight", state["embed.weight"])  # stored once (safetensors shares no storage)
    return state


def checkpoint_tokenizer(ckpt: Path, spec: str) -> str:
    """The tokenizer of checkpoint `ckpt` whose config names `spec`: the copy saved in the
    checkpoint, else (checkpoints written before tokenizers were saved) `spec` itself."""
    if spec == "byte":
        return spec
    saved = ckpt / f"{TOKENIZER_STEM}{Path(spec).suffix}"
    return str(saved) if saved.is_file() else spec


def _deepspeed_environment() -> None:
    """As `fsframework.parallel.process_group.setup_environment`: on a CPU-only host tell DeepSpeed
    before it is imported, so it never probes for CUDA extensions."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def _has_full_module(ds_dir: Path) -> bool:
    files = sorted(ds_dir.glob("mp_rank_*_model_states.pt"))
    if not files:
        return False
    module = safe_load(files[0]).get("module")
    return bool(module) and all(t.numel() > 0 for t in module.values())


@dataclass
class Checkpoint:
    """One resolved and verified checkpoint directory. Its weights are consolidated (ZeRO shards
    merged) at most once per object: `state_dict()` caches them."""

    path: Path
    _state: Optional[dict] = field(default=None, repr=False, compare=False)

    @classmethod
    def open(cls, path: str | Path) -> "Checkpoint":
        """A run directory, its checkpoints/ folder or one checkpoint, resolved and verified."""
        return cls(resolve_checkpoint(path))

    @property
    def is_export(self) -> bool:
        return is_export(self.path)

    @property
    def run(self) -> RunDir:
        """The run directory it belongs to; an export directory is its own (scores go to its eval/)."""
        return RunDir(self.path) if self.is_export else RunDir.of_checkpoint(self.path)

    @property
    def config_file(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def engine_dir(self) -> Path:
        return self.path / ENGINE_TAG

    @property
    def fp32_file(self) -> Path:
        return self.path / FP32_FILE

    def client_state_file(self, rank: int) -> Path:
        return self.path / client_state_name(rank)

    def config(self, overrides: Optional[list[str]] = None) -> "Config":
        """The checkpoint's config (migrated, `overrides` applied); `data.tokenizer` names the
        checkpoint's saved copy of its tokenizer when it has one."""
        cfg = read_config(self.config_file, overrides)
        cfg.data.tokenizer = checkpoint_tokenizer(self.path, cfg.data.tokenizer)
        return cfg

    def engine_state_dict(self) -> dict[str, "torch.Tensor"]:
        """fp32 model weights read from the engine state (any ZeRO stage), never from model_fp32.pt."""
        _deepspeed_environment()
        ds_dir = self.engine_dir
        if any(ds_dir.glob("zero_pp_rank_*_mp_rank_*_optim_states.pt")) and not _has_full_module(ds_dir):
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

            with weights_only_loads():  # DeepSpeed's merge reads every shard through safe_load
                try:
                    state = get_fp32_state_dict_from_zero_checkpoint(str(self.path), tag=ENGINE_TAG)
                except CheckpointError:
                    raise
                except Exception as exc:  # shards that do not fit together
                    raise CheckpointError(f"checkpoint {self.path}: the ZeRO shards in {ds_dir} do not merge "
                                          f"({type(exc).__name__}: {exc})") from None
        else:
            files = sorted(ds_dir.glob("mp_rank_*_model_states.pt"))
            if not files:
                raise CheckpointError(f"checkpoint {self.path}: no model states in {ds_dir}")
            state = safe_load(files[0])
            if not isinstance(state, dict) or not isinstance(state.get("module"), dict):
                raise CheckpointError(f"checkpoint file {files[0]} holds no model state (\"module\")")
            state = state["module"]
        return _plain_keys(state)

    def state_dict(self) -> dict[str, "torch.Tensor"]:
        """fp32 model weights, keys as in the plain model: an export's model.safetensors,
        model_fp32.pt when written, else the engine state consolidated. Computed once."""
        if self._state is None:
            if self.is_export:
                self._state = read_export_weights(self.path)
            elif self.fp32_file.is_file():
                self._state = _plain_keys(safe_load(self.fp32_file))
            else:
                self._state = self.engine_state_dict()
        return self._state

    def load_model(self, device: Any = "cpu", overrides: Optional[list[str]] = None):
        """(model, config): the model of the checkpoint's config with its weights, fp32, eval mode."""
        from fsframework.models.registry import attention_kind, build_model

        cfg = self.config(overrides)
        model = build_model(cfg.model)
        state = self.state_dict()
        source = self.path if self.is_export else self.fp32_file if self.fp32_file.is_file() else self.engine_dir
        built = f"model {cfg.model.name}" + (f" with {' '.join(overrides)}" if overrides else "")
        check_state_dict(model, state, f"checkpoint {source} (for {built})", tied=cfg.model.tie_embeddings)
        model.load_state_dict(state, strict=False)
        if attention_kind(cfg.model.name).calibrated and cfg.model.attention.fsb.forests != "f0":
            self.apply_calibration(model, cfg.model.attention.fsb.calibration)
        return model.to(device).eval(), cfg

    def apply_calibration(self, model, path: str = "") -> Path:
        """Set FS-B's thresholds of `model` from `path` (default: this checkpoint's calibration.json);
        `model.fsb_calibration_file` records the file. Raises CheckpointError when it is missing or
        unreadable, ValueError when its tau does not fit the model."""
        from fsframework.models.freesolo_attention import set_fsb_thresholds

        file = Path(path) if path else self.path / CALIBRATION_FILE
        if not file.is_file():
            raise CheckpointError(f"FS-B needs per-head thresholds and {file} does not exist: run "
                                  f"`fsf calibrate {self.path}` first (or name a file with "
                                  "model.attention.fsb.calibration=FILE)")
        try:
            tau = json.loads(file.read_text())["tau"]
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"calibration file {file} is not valid (a JSON object with \"tau\"): "
                                  f"{exc}") from None
        set_fsb_thresholds(model, tau, str(file))
        model.fsb_calibration_file = str(file)
        return file

    def write_fp32(self) -> Path:
        """Write `state_dict()` to `<checkpoint>/model_fp32.pt` atomically; return its path."""
        import torch

        state = self.state_dict()
        out = self.fp32_file
        tmp = out.with_name(out.name + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, out)
        return out


def _plain_keys(state: dict) -> dict:
    prefix = "model."  # the engine wraps the model in the loss module
    return {k[len(prefix):] if k.startswith(prefix) else k: v.float() for k, v in state.items()}


def consolidated_state_dict(ckpt: Path) -> dict[str, "torch.Tensor"]:
    """fp32 model weights of checkpoint directory `ckpt` (any ZeRO stage), keys as in the plain model."""
    return Checkpoint(Path(ckpt)).state_dict()


def load_model(path: str | Path, device: Any = "cpu", overrides: Optional[list[str]] = None):
    """(model, config) from a run directory or checkpoint, weights in fp32, eval mode. The
    config's `data.tokenizer` names the checkpoint's saved copy of its tokenizer when it has one."""
    return Checkpoint.open(path).load_model(device, overrides)


def write_fp32_model(path: str | Path) -> Path:
    """Consolidate a checkpoint (any ZeRO stage, any number of ranks) into `<ckpt>/model_fp32.pt`.

    `path`: a run directory or checkpoint. The file holds the plain model's fp32
    state dict (keys as in `build_model`), which `load_model` and `fsf eval` then read
    directly instead of merging ZeRO shards each time. Written atomically.
    """
    return Checkpoint.open(path).write_fp32()


def initial_weights(path: str | Path) -> dict[str, "torch.Tensor"]:
    """Weights for `train.init_from`: a run directory, checkpoint or export (as `resolve_checkpoint`),
    a `.safetensors` file, or one `.pt` file holding a plain state dict, bare or under "model", so a
    model trained outside the trainer can start a run."""
    import torch

    path = Path(path)
    if not path.is_file():
        return Checkpoint.open(path).state_dict()
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return {k: v.float() for k, v in load_file(path).items()}
        except Exception as exc:
            raise CheckpointError(f"weights file {path} is truncated or not a safetensors file: {exc}") from None
    state = safe_load(path, what="weights file")
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"weights file {path} holds no state dict (name -> tensor)")
    return {k: v.float() for k, v in state.items()}
