"""Run directories and checkpoints, one job per module (docs/checkpoints.md):

- `layout`: the files of a run directory and a checkpoint (`RunDir`, step names, the manifest
  check `verify`), and which checkpoint a path means (`resolve_checkpoint`);
- `reading`: safe torch loading with its allow-lists, export weights, `Checkpoint` (its config,
  its weights consolidated from ZeRO shards once, `write_fp32`);
- `loading`: `load_weights`, the one path from weights into a model, and `load_model`
  (with FS-B's calibration) and `init_from` on top of it;
- `writing`: atomic save, manifest, pruning, the tokenizer file (the trainer's; imported as a module).

Torch, DeepSpeed and the models are imported where they are used, so importing this package does not load
them (the command line imports it at start-up); `writing`, which the package does not import, uses torch.
"""

from fsframework.checkpoints.layout import (CALIBRATION_FILE, CONFIG_FILE, ENGINE_TAG, EXPORT_HF_CONFIG,
                                            EXPORT_WEIGHTS, FP32_FILE, LATEST, MANIFEST, STEP_PREFIX, TMP_PREFIX,
                                            TOKENIZER_STEM, CheckpointError, CheckpointWarning, CheckpointWriteFailed, RunDir,
                                            checkpoint_tokenizer, client_state_name, file_digest, find_latest,
                                            is_export, list_checkpoints, read_config, resolve_checkpoint, step_name,
                                            training_step, verify)
from fsframework.checkpoints.loading import apply_calibration, init_from, load_model, load_weights
from fsframework.checkpoints.reading import (Checkpoint, consolidated_state_dict, initial_weights, plain_keys,
                                             read_export_weights, safe_load, weights_only_loads, without_wrapper_prefix,
                                             write_fp32_model)

__all__ = [
    "CALIBRATION_FILE", "CONFIG_FILE", "ENGINE_TAG", "EXPORT_HF_CONFIG", "EXPORT_WEIGHTS", "FP32_FILE", "LATEST",
    "MANIFEST", "STEP_PREFIX", "TMP_PREFIX", "TOKENIZER_STEM", "Checkpoint", "CheckpointError", "CheckpointWarning", "CheckpointWriteFailed",
    "RunDir", "apply_calibration", "checkpoint_tokenizer", "client_state_name", "consolidated_state_dict",
    "file_digest", "find_latest", "init_from", "initial_weights", "is_export", "list_checkpoints", "load_model",
    "load_weights", "plain_keys", "read_config", "read_export_weights", "resolve_checkpoint", "safe_load", "step_name",
    "training_step", "verify", "weights_only_loads", "without_wrapper_prefix", "write_fp32_model",
]
