"""Reading a checkpoint's files: safe torch loading, export weights, ZeRO consolidation.

Every reader here returns fp32 weights under the plain model's names (`plain_keys`), so the one
load path (`fsframework.checkpoints.loading.load_weights`) takes any of them. Torch, DeepSpeed
and safetensors are imported where they are used.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

from fsframework.checkpoints.layout import (CONFIG_FILE, ENGINE_TAG, EXPORT_HF_CONFIG, EXPORT_WEIGHTS, FP32_FILE,
                                            CheckpointError, RunDir, checkpoint_tokenizer, client_state_name,
                                            is_export, read_config, resolve_checkpoint)
from fsframework.quiet import merging_zero_shards

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from fsframework.config import Config

# Engine checkpoints written while the engine held the model inside a loss module name every
# tensor "model.<name>" (so do older model_fp32.pt files and an export's non-tfpp safetensors);
# newer ones name it as the model does. Every reader of such names drops the prefix with
# `without_wrapper_prefix`.
WRAPPER_PREFIX = "model."


def without_wrapper_prefix(state: dict) -> dict:
    """`state` (tensor name -> anything) with an older engine checkpoint's "model." prefix dropped
    from every name; unchanged unless every name carries it."""
    if state and all(key.startswith(WRAPPER_PREFIX) for key in state):
        return {key[len(WRAPPER_PREFIX):]: value for key, value in state.items()}
    return state


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


def _deepspeed_environment() -> None:
    """As `fsframework.parallel.process_group.setup_environment`: on a CPU-only host tell DeepSpeed
    before it is imported, so it never probes for CUDA extensions."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


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
    """Wrap a call into DeepSpeed's checkpoint code only (engine resume, the ZeRO merge, the
    universal conversion): within the block every `torch.load` goes through `safe_load` with
    DeepSpeed's classes allowed, and a damaged file raises CheckpointError naming it.

    Why `torch.load` itself is replaced: DeepSpeed reads its files with `weights_only=False` from
    dozens of call sites across its modules, each through the `torch` module, so no narrower
    hook reaches them all, and torch's own switch (TORCH_FORCE_WEIGHTS_ONLY_LOAD) is as global
    and loses the file's name. The block is kept to the one DeepSpeed call, and restores
    `torch.load` on the way out, error or not. Nested blocks keep the outer one's."""
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


def plain_keys(state: dict) -> dict[str, "torch.Tensor"]:
    """`state` in fp32 under the plain model's names (`without_wrapper_prefix`)."""
    return {k: v.float() for k, v in without_wrapper_prefix(state).items()}


def read_export_weights(path: Path) -> dict[str, "torch.Tensor"]:
    """fp32 weights of export directory `path`, keys as in the plain model: Llama names (a tfpp
    export, model_type "llama") mapped back, the "model." prefix of the other kinds' files dropped.
    Tied weights are stored once; `load_weights` ties them back. Read with safetensors (no pickle);
    a truncated or foreign file raises CheckpointError."""
    from fsframework.models.llama import from_llama_name  # fsframework.models loads torch: not at import

    file = Path(path) / EXPORT_WEIGHTS
    try:
        hf = json.loads((Path(path) / EXPORT_HF_CONFIG).read_text())
    except ValueError as exc:
        raise CheckpointError(f"export {path}: {EXPORT_HF_CONFIG} is not valid JSON ({exc})") from None
    state = read_safetensors(file, what=f"export {path}: {file.name}")
    if hf.get("model_type") == "llama":
        state = {from_llama_name(k): v for k, v in state.items()}
    return plain_keys(state)


def read_safetensors(file: Path, *, what: str) -> dict[str, "torch.Tensor"]:
    """The tensors of a safetensors file as stored; a truncated or foreign file raises
    CheckpointError naming it as `what`."""
    from safetensors.torch import load_file

    try:
        return load_file(file)
    except Exception as exc:  # safetensors raises its own error types for a bad header or short file
        raise CheckpointError(f"{what} is truncated or not a safetensors file ({type(exc).__name__}: {exc})") from None


def _has_full_module(ds_dir: Path) -> bool:
    files = sorted(ds_dir.glob("mp_rank_*_model_states.pt"))
    if not files:
        return False
    module = safe_load(files[0]).get("module")
    return bool(module) and all(t.numel() > 0 for t in module.values())


@dataclass
class Checkpoint:
    """One resolved and verified checkpoint (or export) directory. Its weights are consolidated
    (ZeRO shards merged) at most once per object: `state_dict()` caches them. A model is built
    from it by `fsframework.checkpoints.loading.load_model`."""

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

    @property
    def weights_source(self) -> Path:
        """The file or folder `state_dict()` reads, for messages."""
        return self.path if self.is_export else self.fp32_file if self.fp32_file.is_file() else self.engine_dir

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

            with weights_only_loads(), merging_zero_shards():  # DeepSpeed's merge reads every shard through safe_load
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
        return plain_keys(state)

    def state_dict(self) -> dict[str, "torch.Tensor"]:
        """fp32 model weights, keys as in the plain model: an export's model.safetensors,
        model_fp32.pt when written, else the engine state consolidated. Computed once."""
        if self._state is None:
            if self.is_export:
                self._state = read_export_weights(self.path)
            elif self.fp32_file.is_file():
                self._state = plain_keys(safe_load(self.fp32_file))
            else:
                self._state = self.engine_state_dict()
        return self._state

    def write_fp32(self) -> Path:
        """Write `state_dict()` to `<checkpoint>/model_fp32.pt` atomically; return its path."""
        import torch

        state = self.state_dict()
        out = self.fp32_file
        tmp = out.with_name(out.name + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, out)
        return out


def consolidated_state_dict(ckpt: Path) -> dict[str, "torch.Tensor"]:
    """fp32 model weights of checkpoint directory `ckpt` (any ZeRO stage), keys as in the plain model."""
    return Checkpoint(Path(ckpt)).state_dict()


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
        return plain_keys(read_safetensors(path, what=f"weights file {path}"))
    state = safe_load(path, what="weights file")
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"weights file {path} holds no state dict (name -> tensor)")
    return plain_keys(state)
