"""Conversion: a checkpoint as a self-contained safetensors directory that transformers reads
(`export_checkpoint`), and a transformers Llama checkpoint as a tfpp model (`import_llama`),
each proved by logits (docs/export.md). Above `fsframework.checkpoints`, which reads exports
back; below eval, train and the CLI."""

from fsframework.export.llama_import import import_llama
from fsframework.export.writer import ExportError, ExportResult, ProofFailed, export_checkpoint

__all__ = ["ExportError", "ExportResult", "ProofFailed", "export_checkpoint", "import_llama"]
