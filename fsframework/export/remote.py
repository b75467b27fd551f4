"""The kinds that are not the Llama architecture, for transformers: config.json fields and the
modeling file an export carries (`modeling_fsframework.py`, read with trust_remote_code=True).

The modeling file builds the model through fsframework itself (`build_language_model`), so the
math stays in one place (docs/architecture.md): transformers only loads the tensors and drives
`generate()`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Optional

from fsframework.config import ModelConfig, migrate
from fsframework.models.registry import build_model

MODELING_FILE = "modeling_fsframework.py"
TENSOR_PREFIX = "model."  # FSFrameworkForCausalLM holds the fsframework model as `self.model`
# the schema version of the first exports: an older export's modeling file passes none
FIRST_EXPORT_SCHEMA = 2


def model_config_from_dict(data: dict[str, Any], schema_version: Optional[int] = None) -> ModelConfig:
    """A ModelConfig from its plain-dict form (config.json's `fsframework.model`), written in
    `schema_version` (config.json's `fsframework.schema_version`; None: FIRST_EXPORT_SCHEMA) and
    migrated from it, strict: an unknown key fails naming it."""
    from omegaconf import OmegaConf

    data = migrate({"schema_version": schema_version or FIRST_EXPORT_SCHEMA, "model": data})["model"]
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.create(data)))


def build_language_model(data: dict[str, Any], schema_version: Optional[int] = None):
    """The fsframework model of config.json's `fsframework.model` (random weights, eval mode)."""
    return build_model(model_config_from_dict(data, schema_version)).eval()


def remote_code_config(model: ModelConfig, *, torch_dtype: str) -> dict[str, Any]:
    """config.json fields for an export read through `modeling_fsframework.py`."""
    stem = Path(MODELING_FILE).stem
    return {
        "architectures": ["FSFrameworkForCausalLM"],
        "model_type": "fsframework",
        "auto_map": {"AutoConfig": f"{stem}.FSFrameworkConfig",
                     "AutoModelForCausalLM": f"{stem}.FSFrameworkForCausalLM"},
        "vocab_size": model.vocab_size,
        "hidden_size": model.d_model,
        "num_hidden_layers": model.n_layers,
        "tie_word_embeddings": model.tie_embeddings,
        "use_cache": False,
        "torch_dtype": torch_dtype,
    }


def write_modeling_file(out: Path) -> Path:
    """Copy the modeling file into export directory `out`."""
    target = Path(out) / MODELING_FILE
    shutil.copyfile(Path(__file__).with_name(MODELING_FILE), target)
    return target
