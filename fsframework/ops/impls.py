"""The names of an op's implementations (`fsframework.ops.dispatch`). No torch here: the config
validates `model.attention.impl` against them without importing it."""

from __future__ import annotations

IMPLS = ("auto", "reference", "triton")


def check_impl(impl: str) -> None:
    """Raise ValueError unless `impl` is one of `IMPLS`."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
