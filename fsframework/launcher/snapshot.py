"""Code and config snapshots: a job runs the code as it was at launch, not as it is
when the scheduler gets round to starting it (or when someone edits the checkout).

Layout of `<run_dir>/launch/<timestamp>/`:
    config.yaml        the resolved config (YAML file + overrides, validated)
    src/fsframework/   the package source
    src/kernels/       the Triton kernels folder (import name `fsf_kernels`)
    src/yamls/, src/pyproject.toml
    command.sh / job.sbatch   the generated launch script
"""

from __future__ import annotations

import importlib.util
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from fsframework.launcher.errors import LaunchError

# Build outputs, environments, run outputs and data caches are large and not code.
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", ".venv", "venv", "runs", "data_cache", "*.egg-info",
                                ".pytest_cache", ".git", ".mypy_cache", ".ruff_cache")


@dataclass(frozen=True)
class Snapshot:
    dir: Path

    @property
    def config(self) -> Path:
        return self.dir / "config.yaml"

    @property
    def src(self) -> Path:
        return self.dir / "src"

    @property
    def pythonpath(self) -> list[Path]:
        """Import roots: the package and the kernels folder (which holds `fsf_kernels`)."""
        return [self.src, self.src / "kernels"]


def _package_dir(name: str) -> Path | None:
    # find_spec locates a top-level package without running its __init__ (no triton import).
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def source_items() -> dict[str, Path]:
    """What a snapshot copies: name under src/ -> path of the running checkout."""
    package = _package_dir("fsframework")
    if package is None:  # pragma: no cover - we are running from it
        raise LaunchError("cannot locate the fsframework package source")
    items = {"fsframework": package}
    root = package.parent
    kernels = _package_dir("fsf_kernels")
    if (root / "kernels").is_dir():
        items["kernels"] = root / "kernels"
    elif kernels is not None:
        items["kernels/fsf_kernels"] = kernels
    for extra in ("yamls", "pyproject.toml"):
        if (root / extra).exists():
            items[extra] = root / extra
    return items


def _new_dir(parent: Path, now: float | None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    candidate, n = parent / stamp, 1
    while candidate.exists():  # two launches in the same second keep separate snapshots
        candidate, n = parent / f"{stamp}-{n}", n + 1
    candidate.mkdir(parents=True)
    return candidate


def take_snapshot(run_dir: Path, config_yaml: str, *, now: float | None = None) -> Snapshot:
    """Write `<run_dir>/launch/<timestamp>/` with the resolved config and a copy of the source."""
    snap = Snapshot(_new_dir(Path(run_dir).resolve() / "launch", now))
    snap.config.write_text(config_yaml)
    for name, path in source_items().items():
        target = snap.src / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            shutil.copytree(path, target, ignore=IGNORE)
        else:
            shutil.copy2(path, target)
    return snap
