"""mosaicml-streaming is imported without its dataset zoo (fsframework/data/streaming_package.py):
what fsframework uses is there, transformers' tokenizers and scikit-learn are not imported, and
the zoo still imports on demand."""

import subprocess
import sys

from tests.utils import REPO

PROBE = """
import importlib
import sys
import fsframework.data.loader
from streaming import MDSWriter, Stream, StreamingDataLoader, StreamingDataset
import streaming
lean = not any(name in sys.modules for name in ("sklearn", "streaming.text", "transformers.models.auto"))
zoo = streaming.text.StreamingC4.__name__
print(lean, zoo, streaming.__version__ == importlib.import_module("streaming._version").__version__)
"""


def test_streaming_imports_without_its_dataset_zoo():
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "StreamingC4", "True"], proc.stdout + proc.stderr
