"""Data: tokenizers, corpora, MDS shards and the streaming loaders."""

from fsframework.data import streaming_package

streaming_package.install()
