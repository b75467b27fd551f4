"""mosaicml-streaming without its dataset zoo.

`import streaming` runs the package's `__init__`, which imports its ready-made datasets
(`streaming.text`, `.vision`, `.multimodal`); the text ones import transformers' tokenizer
auto-classes, and through them scikit-learn where it is installed: seconds of CPU in every
process, on every rank of every job, for classes fsframework never uses. `install()` puts the
package in `sys.modules` without running that `__init__`: its names (`StreamingDataset`,
`MDSWriter`, ...) are those of `streaming.base`, its subpackages (`streaming.text`, ...) still
import when asked for. After `install()`, `from streaming import X` works as before.

`streaming.base` is registered the same way: its `__init__` imports `StreamingDataLoader`, whose
module imports transformers (2.3 s of CPU in a process that has torch already) for two
`isinstance` checks. Its modules (`streaming.base.dataset`, `.format`, ...) import on their own,
and each name of `streaming` imports on first use from the module that defines it: a training
rank reads shards without ever importing transformers (fsframework's loader,
`fsframework.data.sample_loader.SampleCountingLoader`, is not streaming's), and a process that only
builds or inspects shards' text (`fsf data build`'s tokenizing workers) starts in a fraction of
a second.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

ZOO = ("text", "vision", "multimodal")
# where each name of `streaming.base.__all__` is defined
BASE_NAMES = {"StreamingDataLoader": "dataloader", "StreamingDataset": "dataset", "Stream": "stream",
              "LocalDataset": "local", "CSVWriter": "format", "JSONWriter": "format", "MDSWriter": "format",
              "TSVWriter": "format", "XSVWriter": "format"}


def install() -> None:
    """Register the lean `streaming` and `streaming.base` packages (no-op when streaming is
    imported already or not installed)."""
    if "streaming" in sys.modules:
        return
    package = _without_init("streaming")
    if package is None:
        return
    package.__getattr__ = _on_demand
    package.base = _without_init("streaming.base")
    package.base.__getattr__ = _base_name


def _without_init(name: str):
    """The package object of `name`, in `sys.modules`, its `__init__` not run (None: not installed)."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        return None
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    return package


def _base_name(name: str):
    """A name of `streaming.base.__all__`, imported from its own module on first use."""
    if name not in BASE_NAMES:
        raise AttributeError(f"module 'streaming.base' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"streaming.base.{BASE_NAMES[name]}"), name)
    setattr(sys.modules["streaming.base"], name, value)
    return value


def _on_demand(name: str):
    """A name of `streaming.base` (imported on first use), the version, or a dataset subpackage."""
    package = sys.modules["streaming"]
    if name in ZOO:
        return importlib.import_module(f"streaming.{name}")
    if name == "__version__":
        package.__version__ = importlib.import_module("streaming._version").__version__
        return package.__version__
    if name == "base":
        return sys.modules["streaming.base"]
    if name.startswith("__"):  # module protocol probes (__path__, __file__, ...) are not streaming's names
        raise AttributeError(name)
    if name not in BASE_NAMES:
        raise AttributeError(f"module 'streaming' has no attribute {name!r}")
    value = _base_name(name)
    setattr(package, name, value)
    return value
