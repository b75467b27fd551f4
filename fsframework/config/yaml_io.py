"""Reading configs: a job (YAML file <- dotted `key=value` overrides, merged with omegaconf in
strict mode onto the dataclass defaults, then validated), a run's saved config.yaml (migrated
first), and writing one."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from fsframework.config.checks import ConfigError
from fsframework.config.job import Config, validate
from fsframework.config.schema import migrate, reject_old_keys


def _flat_keys(data: Any, prefix: str = "") -> list[str]:
    if not isinstance(data, dict):
        return []
    keys = []
    for key, value in data.items():
        full = f"{prefix}{key}"
        keys.append(full)
        keys.extend(_flat_keys(value, full + "."))
        for entry in value if isinstance(value, list) else []:  # a key of a list's entries: `full[].key`
            keys.extend(k for k in _flat_keys(entry, full + "[].") if k not in keys)
    return keys


def _reject_old_list_keys(data: Optional[dict], overrides: Optional[list[str]]) -> None:
    """The one-line error for a key of a list entry (`data.streams[].source`) that an older schema
    had, in the job file or an override's value."""
    from omegaconf import OmegaConf

    nested = [data or {}]
    try:
        nested.append(OmegaConf.to_container(OmegaConf.from_dotlist([o.lstrip("+~") for o in overrides or []])))
    except Exception:  # an override omegaconf cannot read: its own error says so
        pass
    reject_old_keys([key for tree in nested for key in _flat_keys(tree) if "[]." in key])


def read_yaml(path: str | Path) -> dict:
    """The mapping in YAML file `path`; ConfigError (one line, FILE:LINE:COLUMN for a syntax error)
    when it is missing, unreadable or not a mapping."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except yaml.MarkedYAMLError as exc:  # one line, where an editor jumps to: FILE:LINE:COLUMN
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        what = "; ".join(part for part in (exc.context, exc.problem) if part)
        raise ConfigError(f"{where}: invalid YAML: {what}") from None
    except (OmegaConfBaseException, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"invalid config file {path}: {str(exc).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys, not {type(data).__name__}")
    return data


def _build(data: Optional[dict], overrides: Optional[list[str]]) -> Config:
    """Defaults <- `data` (a nested dict) <- dotted `key=value` overrides, strict, then validated."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException, ValidationError

    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. train.max_steps=10)")
    reject_old_keys([item.split("=", 1)[0].strip() for item in overrides or []])
    try:
        merged = OmegaConf.structured(Config)
        if data:
            merged = OmegaConf.merge(merged, OmegaConf.create(data))
        if overrides:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(list(overrides)))
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        _reject_old_list_keys(data, overrides)  # omegaconf names no place for a list entry's key
        msg = str(exc).splitlines()[0]
        if isinstance(exc, ValidationError) and key:  # the key exists; its value has the wrong type
            raise ConfigError(f"invalid value for config key {key!r}: {msg}") from None
        raise ConfigError(f"invalid config{f' key {key!r}' if key else ''}: {msg}") from None
    return validate(cfg)


def load_config(path: Optional[str | Path] = None, overrides: Optional[list[str]] = None) -> Config:
    """Defaults <- YAML file <- dotted `key=value` overrides, strict, then validated. A key of an
    older schema version (fsframework.config.schema) fails with its new name, or says it was removed."""
    data = None
    if path is not None:
        data = read_yaml(path)
        reject_old_keys(_flat_keys(data))
    return _build(data, overrides)


def load_run_config(path: str | Path, overrides: Optional[list[str]] = None) -> Config:
    """The config.yaml a run saved (in its run directory or a checkpoint), of any schema version:
    migrated to SCHEMA_VERSION, then `overrides` (current keys), validated. The one reader of
    saved configs (resume, `fsf eval`, `fsf convert`, `train.init_from`)."""
    return _build(migrate(read_yaml(path)), overrides)


def to_yaml(cfg: Config) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
