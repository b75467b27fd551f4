"""fsframework: train and evaluate long-context sparse-attention and recurrent LMs."""

__version__ = "0.1.0"
