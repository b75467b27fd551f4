"""The error every config check raises, and the two checks most keys need."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type or invalid."""


def choice(key: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of {', '.join(map(str, allowed))}")


def positive(key: str, value: float, *, zero_ok: bool = False) -> None:
    if value < 0 or (value == 0 and not zero_ok):
        bound = ">= 0" if zero_ok else "> 0"
        raise ConfigError(f"{key}={value!r} is invalid; it must be {bound}")


def positive_fields(group: str, obj: Any, names: tuple[str, ...], *, zero_ok: bool = False) -> None:
    """`positive` for each field `names` of `obj`, named `group.<field>` in a message."""
    for name in names:
        positive(f"{group}.{name}", getattr(obj, name), zero_ok=zero_ok)
