"""`fsf eval RUN --harness TASKS`: lm-evaluation-harness on a checkpoint, through an export.

The checkpoint is exported (`fsf export`, proved) into a temporary folder, which the harness
reads with its `hf` model as any transformers checkpoint: natively for tfpp (a Llama), with
`trust_remote_code` for every other kind (docs/export.md). The temporary folder is removed
afterwards; the results (the harness's JSON, without its per-sample records) are returned.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Optional

from fsframework.checkpoints import Checkpoint
from fsframework.export import export_checkpoint
from fsframework.models.registry import attention_kind


def run_harness(checkpoint: Path, tasks: list[str], *, include_path: Optional[Path] = None, batch_size: int = 1,
                limit: Optional[int] = None) -> dict:
    """Harness results of `tasks` (names, or tasks of YAML files under `include_path`) on `checkpoint`.
    Raises ValueError when lm-eval is not installed or a task is unknown."""
    try:
        from lm_eval import simple_evaluate
        from lm_eval.tasks import TaskManager
    except ImportError as exc:
        raise ValueError("--harness needs lm-evaluation-harness: pip install lm-eval accelerate") from exc
    import torch

    manager = _task_manager(TaskManager, tasks, include_path)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:  # before the export: a typo costs nothing
        raise ValueError(f"--harness: unknown task {', '.join(unknown)} (a task of one's own needs "
                         "--harness-include TASK_DIR)")
    # a native architecture (tfpp: Llama) loads with transformers' own code; the others with theirs
    native = attention_kind(Checkpoint.open(checkpoint).config().model.name).native_export is not None
    with tempfile.TemporaryDirectory(prefix="fsf-harness-") as tmp:
        out = Path(tmp) / "export"
        export_checkpoint(checkpoint, out)
        remote = "" if native else ",trust_remote_code=True"
        results = simple_evaluate(model="hf", model_args=f"pretrained={out},dtype=float32{remote}", tasks=tasks,
                                  task_manager=manager, batch_size=batch_size, limit=limit,
                                  device="cuda" if torch.cuda.is_available() else "cpu")
    return {key: results[key] for key in ("results", "versions", "n-shot", "config") if key in results}


def _task_manager(manager_type, tasks: list[str], include_path: Optional[Path]):
    """The harness's task index: indexing its thousands of built-in task files takes about half
    a minute, so when every asked task is one of the user's own (under `include_path`) only
    those are indexed; otherwise the built-in ones too."""
    if include_path is not None:
        own = manager_type(include_path=str(include_path), include_defaults=False)
        if all(task in own.all_tasks for task in tasks):
            return own
    return manager_type(include_path=str(include_path) if include_path else None)
