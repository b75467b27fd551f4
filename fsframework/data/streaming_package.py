"""mosaicml-streaming without its dataset zoo.

`import streaming` runs the package's `__init__`, which imports its ready-made datasets
(`streaming.text`, `.vision`, `.multimodal`); the text ones import transformers' tokenizer
auto-classes, and through them scikit-learn where it is installed: seconds of CPU in every
process, on every rank of every job, for classes fsframework never uses. `install()` puts the
package in `sys.modules` without running that `__init__`: its names (`StreamingDataset`,
`MDSWriter`, ...) are those of `streaming.base`, its subpackages (`streaming.text`, ...) still
import when asked for. After `install()`, `from streaming import X` works as before.

`streaming.base` itself (which imports torch and transformers' `BatchFeature`) is imported on
the first use of one of its names, not by `install()`: a process that only builds or inspects
shards' text (`fsf data build`'s tokenizing workers) starts in a fraction of a second.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

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
    package.__getattr__ = _on_demand


def _on_demand(name: str):
    """A name of `streaming.base` (imported on first use), the version, or a dataset subpackage."""
    package = sys.modules["streaming"]
    if name in ZOO:
        return importlib.import_module(f"streaming.{name}")
    if name == "__version__":
        package.__version__ = importlib.import_module("streaming._version").__version__
        return package.__version__
    if name.startswith("__"):  # module protocol probes (__path__, __file__, ...) are not streaming's names
        raise AttributeError(name)
    base = importlib.import_module("streaming.base")
    package.__dict__.update({key: getattr(base, key) for key in base.__all__})
    if name in base.__all__:
        return getattr(base, name)
    raise AttributeError(f"module 'streaming' has no attribute {name!r}")
