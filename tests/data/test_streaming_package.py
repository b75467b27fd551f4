"""mosaicml-streaming is imported without its dataset zoo and its data loader
(fsframework/data/streaming_package.py): what fsframework uses is there and reads shards without
importing transformers or scikit-learn, and the rest still imports on demand."""

import subprocess
import sys

from tests.utils import REPO

PROBE = """
import importlib
import sys
import fsframework.data.loader
from fsframework.data.sample_loader import SampleCountingLoader
from streaming import MDSWriter, Stream, StreamingDataset
from streaming.base import LocalDataset
import streaming
lean = not any(name in sys.modules for name in ("sklearn", "streaming.text", "transformers"))
from streaming import StreamingDataLoader  # streaming's own loader, which imports transformers
zoo = streaming.multimodal.StreamingInsideWebVid.__name__  # the lightest of the zoo
print(lean, zoo, streaming.__version__ == importlib.import_module("streaming._version").__version__,
      "transformers" in sys.modules)
"""


def test_streaming_imports_without_its_dataset_zoo():
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "StreamingInsideWebVid", "True", "True"], proc.stdout + proc.stderr
