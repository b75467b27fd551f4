"""mosaicml-streaming without its dataset zoo.

`import streaming` runs the package's `__init__`, which imports its ready-made datasets
(`streaming.text`, `.vision`, `.multimodal`); the text ones import transformers' tokenizer
auto-classes, and through them scikit-learn where it is installed: seconds of CPU in every
process, on every rank of every job, for classes fsframework never uses. `install()` puts the
package in `sys.modules` without running that `__init__`: its names (`StreamingDataset`,
`MDSWriter`, ...) are those of `streaming.base`, its subpackages (`streaming.text`, ...) still
import when asked for. After `install()`, `from streaming import X` works as before.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

ZOO = ("text", "vision", "multimodal")


def install() -> None:
    """Register the lean `streaming` package (no-op when it is imported already or not installed)."""
    if "streaming" in sys.modules:
        return
    spec = importlib.util.find_spec("streaming")
    if spec is None or spec.submodule_search_locations is None:
        return
    package = importlib.util.module_from_spec(spec)  # the package object, its __init__ not run
    sys.modules["streaming"] = package
    try:
        base = importlib.import_module("streaming.base")
        version = importlib.import_module("streaming._version")
    except Exception:
        del sys.modules["streaming"]  # a streaming this module does not know: import it the plain way
        raise
    package.__dict__.update({name: getattr(base, name) for name in base.__all__})
    package.__version__ = version.__version__
    package.__getattr__ = _zoo_on_demand


def _zoo_on_demand(name: str) -> types.ModuleType:
    """`streaming.text` and the other dataset subpackages, imported on first use."""
    if name in ZOO:
        return importlib.import_module(f"streaming.{name}")
    raise AttributeError(f"module 'streaming' has no attribute {name!r}")
