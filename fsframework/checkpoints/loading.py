"""Weights into a model: the one load path, and a checkpoint's model built with its calibration.

`load_weights` is the one place that copies weights into a model (`fsf eval`, `generate`,
`calibrate`, `export`, `import` and `train.init_from` all come through it), under one rule: the
weights fit the model exactly, or a one-line CheckpointError names the source, the model and
every missing, unexpected and mis-shaped tensor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from fsframework.checkpoints.layout import CALIBRATION_FILE, CheckpointError
from fsframework.checkpoints.reading import Checkpoint, initial_weights, plain_keys
from fsframework.config.kinds import kind_facts

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from fsframework.config import Config

_LISTED = 8  # names per kind of misfit in a message; the count says how many more


def _shared_names(model) -> list[list[str]]:
    """Names under which the model holds one tensor more than once (an output layer tied to the
    embedding): a state that stores such a tensor once still fits."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def _misfit(source: str, model_name: str, missing: list[str], unexpected: list[str],
            misshaped: list[str]) -> CheckpointError:
    parts = [f"{label} {len(names)}: {', '.join(names[:_LISTED])}{', ...' if len(names) > _LISTED else ''}"
             for label, names in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped))
             if names]
    return CheckpointError(f"{source} does not fit {model_name}: {'; '.join(parts)}")


def load_weights(model, state: dict[str, "torch.Tensor"], source: str, *, model_name: str = "") -> None:
    """Copy `state` into `model`, strictly: every tensor of the model present with its shape and
    nothing else, or CheckpointError naming `source` (and `model_name`, default "model <kind>").

    Accepted as fitting: names with the engine's `model.` prefix (every engine state, and the
    model_fp32.pt of older checkpoints); a tensor the model shares under two names stored under
    one of them (tied embeddings: exports and Llama files store it once); older names that the
    model's own load hooks rename (AR-GRC's `cell.*`). Mis-shaped tensors are refused before
    anything is copied; after an error the model holds partly copied weights and is not used."""
    state = plain_keys(state)
    for group in _shared_names(model):
        stored = next((name for name in group if name in state), None)
        if stored is not None:
            for name in group:
                state.setdefault(name, state[stored])
    model_name = model_name or f"model {getattr(getattr(model, 'cfg', None), 'name', type(model).__name__)}"
    expected = model.state_dict()
    misshaped = [f"{k} {tuple(state[k].shape)} (model: {tuple(v.shape)})" for k, v in expected.items()
                 if k in state and tuple(state[k].shape) != tuple(v.shape)]
    if misshaped:
        raise _misfit(source, model_name, [k for k in expected if k not in state],
                      [k for k in state if k not in expected], misshaped)
    # strict in effect: torch reports what is left missing or unexpected after the model's hooks
    # renamed older names, and the error below names it in one line instead of torch's many
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise _misfit(source, model_name, list(result.missing_keys), list(result.unexpected_keys), [])


def init_from(model, source: str | Path) -> None:
    """Load `train.init_from`'s weights (any `initial_weights` source) into `model`."""
    load_weights(model, initial_weights(source), f"train.init_from={source}")


def load_model(source: "str | Path | Checkpoint", device: Any = "cpu",
               overrides: Optional[list[str]] = None) -> tuple[Any, "Config"]:
    """(model, config) of a run directory, checkpoint or export (or an open `Checkpoint`): the model
    of its config (`overrides` applied) with its weights, fp32, eval mode, FS-B's thresholds set.
    The config's `data.tokenizer` names the checkpoint's saved copy of its tokenizer when it has one."""
    from fsframework.models.registry import build_model  # torch: importing this package loads none (fsf starts fast)

    ckpt = source if isinstance(source, Checkpoint) else Checkpoint.open(source)
    cfg = ckpt.config(overrides)
    model = build_model(cfg.model)
    built = f"model {cfg.model.name}" + (f" with {' '.join(overrides)}" if overrides else "")
    load_weights(model, ckpt.state_dict(), f"checkpoint {ckpt.weights_source}", model_name=built)
    if kind_facts(cfg.model.name).calibrated and cfg.model.attention.fsb.forests != "f0":
        apply_calibration(model, ckpt, cfg.model.attention.fsb.calibration)
    return model.to(device).eval(), cfg


def apply_calibration(model, ckpt: Checkpoint, path: str = "") -> Path:
    """Set FS-B's thresholds of `model` from `path` (default: the checkpoint's calibration.json);
    `model.fsb_calibration_file` records the file. Raises CheckpointError when it is missing or
    unreadable, ValueError when its tau does not fit the model."""
    from fsframework.models.freesolo_attention import set_fsb_thresholds  # torch, as build_model above

    file = Path(path) if path else ckpt.path / CALIBRATION_FILE
    if not file.is_file():
        raise CheckpointError(f"FS-B needs per-head thresholds and {file} does not exist: run "
                              f"`fsf calibrate {ckpt.path}` first (or name a file with "
                              "model.attention.fsb.calibration=FILE)")
    try:
        tau = json.loads(file.read_text())["tau"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"calibration file {file} is not valid (a JSON object with \"tau\"): "
                              f"{exc}") from None
    set_fsb_thresholds(model, tau, str(file))
    model.fsb_calibration_file = str(file)
    return file
