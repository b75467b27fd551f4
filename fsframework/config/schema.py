"""Versions of the config schema, and bringing a saved config of any version to the current one.

A run's saved config.yaml records `schema_version` (files written before it was recorded are
version 1). `migrate` brings such a file, as a nested dict, to SCHEMA_VERSION: removed keys
dropped, moved keys put in their new place (SCHEMA_MIGRATIONS), added keys set to what the old
version did (SCHEMA_ADDED), values that changed meaning rewritten (SCHEMA_REWRITES). A job file
and an override are written in the current schema: a key of an older version fails with one
line naming its new place (`reject_old_keys`).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Optional

from fsframework.config.checks import ConfigError
from fsframework.config.sources import is_schema4_source_name

SCHEMA_VERSION = 5


def _moved(old_prefix: str, new_prefix: str, names: tuple[str, ...]) -> dict[str, str]:
    return {f"{old_prefix}{name}": f"{new_prefix}{name}" for name in names}


# SCHEMA_MIGRATIONS[v]: the keys changed from schema version v to v + 1, old dotted key ->
# new dotted key, or None for a removed key.
SCHEMA_MIGRATIONS: dict[int, dict[str, Optional[str]]] = {
    1: {
        "model.max_seq_len": None,  # bounded nothing
        "train.copy_warmup_steps": "research.copy_warmup_steps",
        "train.copy_warmup_seq_len": "research.copy_warmup_seq_len",
        "train.copy_warmup_max_passage": "research.copy_warmup_max_passage",
        "train.copy_warmup_draw": "research.copy_warmup_draw",
    },
    2: {},
    # a kind's own settings are a group of their own under model.attention
    3: {
        **_moved("model.attention.fsb_", "model.attention.fsb.",
                 ("top_k", "beam_width", "bound_c", "forests", "calibration")),
        **_moved("model.attention.rewired_", "model.attention.rewired.", ("runway", "score", "head")),
    },
    # data.source's path moved to data.path by value, each stream's source to its path (SCHEMA_REWRITES)
    4: {"data.streams[].source": "data.streams[].path"},
}

# SCHEMA_ADDED[v]: the keys added from schema version v to v + 1, with the value every run of
# version v used (its behaviour then), so an old run keeps it when the new default differs.
SCHEMA_ADDED: dict[int, dict[str, Any]] = {
    1: {},
    # the readout gain g itself trained at optim.lr
    2: {"model.attention.readout_gain_param": "linear", "model.attention.readout_gain_lr": 1.0,
        "model.attention.readout_backward": "gain"},
    3: {},
    4: {},
}


def _source_path_to_data_path(data: dict) -> None:
    """Schema 4 named shards by their path in `data.source` and a mixture's datasets by theirs in
    each `data.streams[i].source`; schema 5 names the source (`data.source=shards`) and puts each
    path in `path` (fsframework.config.sources)."""
    section = data.get("data")
    if not isinstance(section, dict):
        return
    if not is_schema4_source_name(section.get("source", "embedded")):  # schema 4's default: embedded
        section["path"] = section["source"]
        section["source"] = "shards"
    for stream in section.get("streams") or []:
        if isinstance(stream, dict) and "source" in stream:
            stream["path"] = stream.pop("source")


# SCHEMA_REWRITES[v]: changes from schema version v to v + 1 that depend on a value, applied to
# the nested dict after the key moves
SCHEMA_REWRITES: dict[int, Callable[[dict], None]] = {4: _source_path_to_data_path}


def _node(data: dict, parents: list[str], *, create: bool) -> Optional[dict]:
    node = data
    for part in parents:
        node = node.setdefault(part, {}) if create else node.get(part)
        if not isinstance(node, dict):
            return None
    return node


def _place(data: dict, key: str) -> dict:
    """The mapping that holds dotted `key` in `data`, made where missing."""
    node = _node(data, key.split(".")[:-1], create=True)
    if node is None:
        raise ConfigError(f"cannot migrate the saved config to {key}: a value stands where its group belongs")
    return node


def migrate(data: dict) -> dict:
    """A saved config (nested dict, any schema version; none recorded: version 1) brought to
    SCHEMA_VERSION: removed keys dropped, moved keys put in their new place, added keys set to
    the value the old version used (SCHEMA_ADDED), values rewritten (SCHEMA_REWRITES). A new dict."""
    data = copy.deepcopy(data)
    version = data.pop("schema_version", 1)
    if not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        raise ConfigError(f"schema_version={version!r} is unknown: this fsframework reads versions "
                          f"1 .. {SCHEMA_VERSION}")
    for v in range(version, SCHEMA_VERSION):
        for old, new in SCHEMA_MIGRATIONS[v].items():
            if "[]" in old:
                continue  # a key of every entry of a list: SCHEMA_REWRITES moves it
            *parents, leaf = old.split(".")
            node = _node(data, parents, create=False)
            if node is None or leaf not in node:
                continue
            value = node.pop(leaf)
            if new is not None:
                _place(data, new)[new.rpartition(".")[2]] = value
        for added, value in SCHEMA_ADDED[v].items():
            _place(data, added).setdefault(added.rpartition(".")[2], value)
        if v in SCHEMA_REWRITES:
            SCHEMA_REWRITES[v](data)
    data["schema_version"] = SCHEMA_VERSION
    return data


def old_key_error(key: str) -> Optional[ConfigError]:
    """The error for a dotted key that an older schema version had, None for any other key (a key of
    a list's entries is written `data.streams[].path`)."""
    for version in sorted(SCHEMA_MIGRATIONS):
        changes = SCHEMA_MIGRATIONS[version]
        if key in changes:
            new = changes[key]
            if new is None:
                return ConfigError(f"config key {key} was removed in schema_version {version + 1}; delete it")
            return ConfigError(f"config key {key} moved to {new} in schema_version {version + 1}; "
                               f"write {new} instead")
    return None


def reject_old_keys(keys: list[str]) -> None:
    """Raise one ConfigError (one line) naming every key of an older schema version among the
    dotted `keys` (an override's `+`/`~` prefix ignored)."""
    errors = [str(error) for error in map(old_key_error, (key.lstrip("+~") for key in keys)) if error is not None]
    if errors:
        raise ConfigError("; ".join(errors))
