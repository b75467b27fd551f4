"""`fsf export`: a checkpoint (any ZeRO stage, any data- or sequence-parallel layout) as one
self-contained directory that other tools read (docs/export.md):

    config.json                  transformers config: LlamaConfig for tfpp, else the remote-code
                                 config; `fsframework` records the model config and the versions
    model.safetensors            the weights (fp32 or bf16; a tied lm_head stored once)
    config.yaml                  the run's full config, paths absolute: data and eval settings
    tokenizer.json | .model      the run's tokenizer (the byte tokenizer written as a tokenizer.json, a
                                 sentencepiece .model with a tokenizer.json of the same pieces),
                                 with tokenizer_config.json and special_tokens_map.json
    generation_config.json       EOS and pad ids for transformers' generate()
    calibration.json             FS-B thresholds, when the checkpoint has them
    modeling_fsframework.py      every kind but tfpp: the transformers entry point

No pickle: tensors in safetensors, the rest JSON, YAML and text. The directory is written under
a temporary name, proved (the logits of a fixed batch from the source weights and from the
directory read back), and renamed into place only when the proof holds.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch

from fsframework.checkpoints import (CALIBRATION_FILE, CONFIG_FILE, EXPORT_HF_CONFIG, EXPORT_WEIGHTS,
                                     Checkpoint, CheckpointError, checkpoint_tokenizer, load_model, load_weights,
                                     read_config, training_step)
from fsframework.config import SCHEMA_VERSION, Config, ModelConfig, to_yaml
from fsframework.export.hf_tokenizer import generation_config, write_tokenizer_files
from fsframework.export.proof import logits_of, max_difference, proof_batch
from fsframework.export.remote import TENSOR_PREFIX, remote_code_config, write_modeling_file
from fsframework.models.llama import model_config_dict
from fsframework.models.registry import attention_kind, build_model

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TORCH_DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16"}


class ExportError(ValueError):
    """Bad input to an export or an import (exit 2)."""


class ProofFailed(RuntimeError):
    """The written weights do not reproduce the source's logits (a failed run, exit 1)."""


@dataclass
class ExportResult:
    out: Path
    max_difference: float  # source (rounded to the export dtype) vs the directory read back: 0
    rounding_drift: Optional[float]  # bf16 only: fp32 source logits vs the exported ones
    seconds: float
    tensors: int


def framework_record(model: ModelConfig, **extra: Any) -> dict[str, Any]:
    """config.json's `fsframework` entry: versions and the model config."""
    import sys

    # the package's version string, read from the already-imported package: importing
    # `fsframework` itself would count as an import of the top layer (docs/architecture.md)
    version = sys.modules["fsframework"].__version__
    return {"version": version, "schema_version": SCHEMA_VERSION, "model": model_config_dict(model), **extra}


def export_tensors(state: dict[str, torch.Tensor], model: ModelConfig, dtype: str) -> dict[str, torch.Tensor]:
    """The tensors of model.safetensors: a tied lm_head dropped (safetensors stores no shared
    storage; loaders tie it back), a native architecture's names (Llama's for tfpp), else under `model.`."""
    native = attention_kind(model.name).native_adapter()
    rename = native.to_native_name if native else (lambda k: TENSOR_PREFIX + k)
    return {rename(k): v.detach().to(DTYPES[dtype]).contiguous() for k, v in state.items()
            if not (model.tie_embeddings and k == "lm_head.weight")}


def _training_cwd(cfg: Config, run_root: Path) -> Path:
    """The directory the run was started from, where its relative paths point: `run_root` minus a
    relative `run_dir` when it ends with it, else the current directory."""
    rel = Path(cfg.run_dir)
    root = run_root.resolve()
    if not rel.is_absolute() and rel.parts and root.parts[-len(rel.parts):] == rel.parts:
        return Path(*root.parts[:-len(rel.parts)])
    return Path.cwd()


def absolute_paths(cfg: Config, base: Path) -> Config:
    """`cfg` with its local paths (data, cache, tokenizer, run dir, init_from, tau file) made
    absolute against `base`; remote (`s3://`) data and "byte" are kept."""

    def absolute(value: Optional[str]) -> Optional[str]:
        if not value or "://" in value or Path(value).is_absolute():
            return value
        return str((base / value).resolve())

    d = cfg.data
    d.path = absolute(d.path)
    for stream in d.streams:
        stream.path = absolute(stream.path)
    d.cache_dir = absolute(d.cache_dir)
    if d.tokenizer != "byte":
        d.tokenizer = absolute(d.tokenizer)
    cfg.run_dir = absolute(cfg.run_dir)
    cfg.train.init_from = absolute(cfg.train.init_from)
    cfg.model.attention.fsb.calibration = absolute(cfg.model.attention.fsb.calibration)
    return cfg


def _write_tokenizer(ckpt: Checkpoint, cfg: Config, spec: str, tmp: Path) -> int:
    """The tokenizer files (fsframework.export.hf_tokenizer); returns the EOS id."""
    source = None
    if spec != "byte":
        source = Path(checkpoint_tokenizer(ckpt.path, spec))
        if not source.is_file():
            raise ExportError(f"tokenizer {source} of checkpoint {ckpt.path} not found")
    return write_tokenizer_files(spec, source, tmp, _longest(cfg))


def _longest(cfg: Config) -> int:
    return max([cfg.data.seq_len, *cfg.eval.lengths])


def hf_config(cfg: Config, dtype: str, source: Path, eos_id: Optional[int] = None, step: int = 0) -> dict[str, Any]:
    """config.json: transformers' fields (a native architecture's, Llama's for tfpp), the
    tokenizer's EOS (also the pad token) and the `fsframework` record (with the training step,
    where evaluations log)."""
    record = framework_record(cfg.model, source=str(source), dtype=dtype, step=step)
    if eos_id is None and cfg.data.tokenizer == "byte":
        eos_id = 256  # the byte tokenizer's end of text (fsframework.data.tokenizers)
    special = {"bos_token_id": None, "eos_token_id": eos_id, "pad_token_id": eos_id}
    native = attention_kind(cfg.model.name).native_adapter()
    if native:
        fields = native.native_config(cfg.model, max_positions=_longest(cfg), torch_dtype=TORCH_DTYPE_NAMES[dtype])
    else:
        fields = remote_code_config(cfg.model, torch_dtype=TORCH_DTYPE_NAMES[dtype])
    return {**fields, **special, "fsframework": record}


def save_weights(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """model.safetensors, readable like every other file the process writes: safetensors creates
    its file private (0600), which would hide an export from the rest of a shared group."""
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


@contextmanager
def staged_out_dir(out: Path) -> Iterator[Path]:
    """A temporary directory beside `out` to write an export in: renamed to `out` when the block
    completes, removed when it raises (a failed proof leaves nothing). `out` must not exist or
    be empty."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"output directory {out} exists and is not empty: name a new directory")
    tmp = out.parent / f".tmp-{out.name}"
    if tmp.exists():
        shutil.rmtree(tmp)  # left by an interrupted export
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if out.is_dir():
            out.rmdir()  # empty (checked above)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def export_checkpoint(source: str | Path, out: str | Path, *, dtype: str = "fp32",
                      log: Callable[[str], Any] = lambda _m: None) -> ExportResult:
    """Export the checkpoint at `source` (run dir, checkpoint or export) to `out`, proved."""
    if dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    started = time.perf_counter()
    out = Path(out)
    ckpt = Checkpoint.open(source)
    saved = read_config(ckpt.config_file)  # as the run saved it (the tokenizer spec unresolved)
    cfg = ckpt.config()
    state = ckpt.state_dict()  # ZeRO shards merged once
    model = build_model(cfg.model).eval()
    load_weights(model, state, f"checkpoint {ckpt.weights_source}")
    log(f"read {ckpt.path} ({cfg.model.name}, {len(state)} tensors) in {time.perf_counter() - started:.1f}s")

    with staged_out_dir(out) as tmp:
        tensors = export_tensors(model.state_dict(), cfg.model, dtype)
        save_weights(tensors, tmp / EXPORT_WEIGHTS)
        (tmp / CONFIG_FILE).write_text(to_yaml(absolute_paths(saved, _training_cwd(saved, ckpt.run.root))))
        eos_id = _write_tokenizer(ckpt, cfg, saved.data.tokenizer, tmp)
        if (ckpt.path / CALIBRATION_FILE).is_file():
            shutil.copyfile(ckpt.path / CALIBRATION_FILE, tmp / CALIBRATION_FILE)
        if attention_kind(cfg.model.name).native_export is None:
            write_modeling_file(tmp)
        (tmp / EXPORT_HF_CONFIG).write_text(json.dumps(hf_config(cfg, dtype, ckpt.path.resolve(), eos_id,
                                                                  training_step(ckpt.path)), indent=2))
        (tmp / "generation_config.json").write_text(json.dumps(generation_config(eos_id), indent=2))
        difference, drift = prove(model, tmp, dtype)
        if difference != 0.0:
            raise ProofFailed(f"the exported weights do not reproduce the checkpoint's logits (largest difference "
                              f"{difference:.3g}, expected 0)")
    return ExportResult(out, difference, drift, time.perf_counter() - started, len(tensors))


def prove(source_model, exported: Path, dtype: str) -> tuple[float, Optional[float]]:
    """(largest logit difference between the source weights rounded to `dtype` and the export read
    back as every fsframework loader reads it, which must be 0; for bf16 also the drift of the
    exported logits from the fp32 source's)."""
    tokens = proof_batch(source_model.cfg.vocab_size)
    reference = logits_of(source_model, tokens)
    if dtype != "fp32":  # the source as the export stores it: every tensor rounded once
        rounded = {k: v.to(DTYPES[dtype]).float() for k, v in source_model.state_dict().items()}
        load_weights(source_model, rounded, f"the source rounded to {dtype}")
        expected = logits_of(source_model, tokens)
    else:
        expected = reference
    try:
        model, _ = load_model(exported)
    except CheckpointError as exc:
        raise ProofFailed(f"the written export does not read back: {exc}") from None
    got = logits_of(model, tokens)
    drift = max_difference(reference, got) if dtype != "fp32" else None
    return max_difference(expected, got), drift
